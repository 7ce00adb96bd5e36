//! `coorfs analyze`: measure and predict data stalls before training (DS-Analyzer's what-if
//! analysis, VLDB 2021, in one command).

pub mod measure;
pub mod scan;
pub mod simulate;
