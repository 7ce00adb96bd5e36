//! The node journal: every node id given out, with its parent, name and kind, in order, for
//! a successor to replay into a node table with the same ids.

use super::*;

/// One node of the journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalNode {
    pub id: NodeId,
    pub parent: NodeId,
    pub kind: Kind,
    pub name: Vec<u8>,
}

/// Record layout: id u32, parent u32, kind u8, name length u16, name.
const RECORD_HEAD: usize = 11;
/// Every node id given out, in order (see the module header).
#[derive(Debug)]
pub struct NodeJournal {
    /// Appends are serialised by the node table's write lock too.
    pub(super) log: Log,
}

impl NodeJournal {
    pub fn create() -> io::Result<NodeJournal> {
        let log = Log::create(
            "coorfs-nodes",
            JOURNAL_RESERVE,
            JOURNAL_MAGIC,
            JOURNAL_VERSION,
        )?;
        Ok(NodeJournal { log })
    }

    pub fn open(fd: OwnedFd) -> io::Result<NodeJournal> {
        let log = Log::open(
            fd,
            JOURNAL_RESERVE,
            JOURNAL_MAGIC,
            JOURNAL_VERSION,
            "node journal",
        )?;
        Ok(NodeJournal { log })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.log.region.fd.as_fd()
    }

    /// False once an append failed: the journal no longer holds every node.
    pub fn whole(&self) -> bool {
        self.log.whole()
    }

    /// Records node `id`, child `name` of `parent`, of kind `kind`.
    pub fn append(&self, id: NodeId, parent: NodeId, kind: Kind, name: &[u8]) {
        let _g = self.log.append.lock();
        let len = RECORD_HEAD + name.len();
        let Some(at) = self.log.room(len, "node journal") else {
            return;
        };
        let mut rec = Vec::with_capacity(len);
        rec.extend_from_slice(&(id as u32).to_le_bytes());
        rec.extend_from_slice(&(parent as u32).to_le_bytes());
        rec.push(kind_code(kind));
        rec.extend_from_slice(&(name.len() as u16).to_le_bytes());
        rec.extend_from_slice(name);
        // SAFETY: [at, at + len) is inside the sized file (`room`) and past the committed
        // length, which no reader reads beyond; only this writer (the append lock) writes it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                rec.as_ptr(),
                self.log.region.base().add(at as usize),
                rec.len(),
            );
        }
        self.log
            .region
            .word(16)
            .store(at + len as u64, Ordering::Release);
    }

    /// Every committed node, in the order given out.
    pub fn nodes(&self) -> io::Result<Vec<JournalNode>> {
        let end = self.log.committed("node journal")?;
        // SAFETY: [0, end) is inside the sized file and committed: nobody writes it again.
        let bytes = unsafe { std::slice::from_raw_parts(self.log.region.base(), end) };
        parse_journal(&bytes[JOURNAL_START..])
    }
}

impl crate::namespace::NodeLog for NodeJournal {
    fn node_added(&self, id: NodeId, parent: NodeId, kind: Kind, name: &[u8]) {
        self.append(id, parent, kind, name);
    }
}

fn parse_journal(mut bytes: &[u8]) -> io::Result<Vec<JournalNode>> {
    let mut nodes = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < RECORD_HEAD {
            return Err(bad("node journal: torn record".into()));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let len = u16::from_le_bytes([bytes[9], bytes[10]]) as usize;
        let kind = kind_of(bytes[8]).ok_or_else(|| bad("node journal: bad kind".into()))?;
        if bytes.len() < RECORD_HEAD + len {
            return Err(bad("node journal: torn name".into()));
        }
        nodes.push(JournalNode {
            id: u32_at(0).into(),
            parent: u32_at(4).into(),
            kind,
            name: bytes[RECORD_HEAD..RECORD_HEAD + len].to_vec(),
        });
        bytes = &bytes[RECORD_HEAD + len..];
    }
    Ok(nodes)
}

fn kind_code(kind: Kind) -> u8 {
    match kind {
        Kind::File => 1,
        Kind::Dir => 2,
        Kind::Symlink => 3,
        Kind::Fifo => 4,
        Kind::Socket => 5,
        Kind::CharDevice => 6,
        Kind::BlockDevice => 7,
    }
}

fn kind_of(code: u8) -> Option<Kind> {
    Some(match code {
        1 => Kind::File,
        2 => Kind::Dir,
        3 => Kind::Symlink,
        4 => Kind::Fifo,
        5 => Kind::Socket,
        6 => Kind::CharDevice,
        7 => Kind::BlockDevice,
        _ => return None,
    })
}
