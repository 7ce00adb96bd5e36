//! The man page, generated from the clap definitions.
