//! The statistics of the mount, as the views read them: one [`Snapshot`] of every stat
//! (for `coorfs stats`, the JSON attribute and the metrics server), and the extended
//! attributes of the root (`user.coorfs.*`, one per stat) and of each file
//! (`user.coorfs.cached`). Every name comes from [`crate::stats`].

use std::ffi::OsStr;
use std::sync::atomic::Ordering;

use super::{DatasetFs, FsError, order, source_error};
use crate::namespace::{Kind, NodeId, ROOT};
use crate::stats::{self, Counters, Snapshot, Stat, Value};

/// Counters read once for a whole snapshot (see [`DatasetFs::stat_value`]); `reads`, `hits`
/// and `misses` under the epochs lock, under which opens count them, so that they add up.
#[derive(Clone, Copy, Debug)]
struct Sample {
    reads: u64,
    hits: u64,
    misses: u64,
    /// Rounds of files read from the source (for `source_reads_per_file`).
    from_source: u64,
    epoch: u64,
}

impl DatasetFs {
    /// Where the FUSE adapter counts the requests it answers.
    pub fn requests(&self) -> &crate::stats::Requests {
        &self.reads.ledger.stats().requests
    }

    /// How the kernel's requests reach the daemon, for stat `transport`: `io_uring` says
    /// whether they come over io_uring now (set once, by the FUSE session).
    pub fn set_transport(&self, io_uring: Box<dyn Fn() -> bool + Send + Sync>) {
        self.reads.ledger.stats().transport.set(io_uring);
    }

    /// Every stat, now: the opens the kernel told of so far counted first, so that what a
    /// reader did before it asked shows.
    pub fn snapshot(&self) -> Snapshot {
        self.drain_told();
        let stats = self.reads.ledger.stats();
        let mut jobs = self.reads.jobs.summaries(stats.now());
        for j in jobs.iter_mut().filter(|j| j.active) {
            j.kept_blocks = self.reads.tiers.staging.needed_by(j.key);
            j.staged_bytes = self.reads.tiers.staging.held_by(j.key);
        }
        let c = &stats.counters;
        let from_source = self.reads.ledger.file_rounds_from_source();
        let epochs = stats.epochs.lock();
        let sample = Sample {
            reads: Counters::get(&c.reads),
            hits: Counters::get(&c.hits),
            misses: Counters::get(&c.misses),
            from_source,
            epoch: epochs.tracker().epoch(),
        };
        let values = Stat::ALL
            .iter()
            .map(|s| (*s, self.stat_value(*s, &sample)))
            .collect();
        let records = epochs.records().to_vec();
        drop(epochs);
        Snapshot {
            values,
            info: self
                .info
                .iter()
                .cloned()
                .chain([("cache_budget_why", self.elastic.state.why.lock().clone())])
                .chain({
                    let (who, why) = self.opener.opens.state();
                    [("opens", who.to_string()), ("opens_why", why)]
                })
                .chain(
                    (self.daemons().restarts.last_cause)
                        .map(|c| ("daemon_last_end", c.to_string())),
                )
                .chain(self.cluster_info())
                .collect(),
            epochs: records,
            jobs: serde_json::to_value(jobs).unwrap_or_default(),
            requests: self.reads.ledger.stats().requests.json(),
        }
    }

    /// The value of `stat` now; the counters that several stats derive from as `sample` read
    /// them, so that those stats agree with each other.
    fn stat_value(&self, stat: Stat, sample: &Sample) -> Value {
        let stats = self.reads.ledger.stats();
        let c = &stats.counters;
        let cache = &self.reads.tiers.memory;
        let cc = &cache.counters;
        let disk = self.reads.tiers.disk.as_deref();
        let Sample {
            reads,
            hits,
            misses,
            from_source,
            epoch,
        } = *sample;
        match stat {
            Stat::Reads => Value::Count(reads),
            Stat::Hits => Value::Count(hits),
            Stat::Misses => Value::Count(misses),
            Stat::HitRate => Value::Ratio(if reads == 0 {
                0.0
            } else {
                hits as f64 / reads as f64
            }),
            Stat::BytesRead => Value::Count(Counters::get(&c.bytes_read)),
            Stat::ByteHitRate => Value::Ratio(crate::stats::byte_hit_rate(
                Counters::get(&c.bytes_read),
                Counters::get(&c.bytes_from_source),
            )),
            Stat::BytesFromCache => Value::Count(Counters::get(&c.bytes_from_cache)),
            Stat::BytesFromSource => Value::Count(Counters::get(&c.bytes_from_source)),
            Stat::CachedBytes => Value::Count(cache.cached_bytes()),
            Stat::CachedFiles => Value::Count(cache.cached_files()),
            Stat::CachedBlocks => Value::Count(cache.cached_blocks()),
            Stat::CacheUsed => Value::Count(cache.used()),
            Stat::CacheCapacity => Value::Count(cache.capacity()),
            Stat::CacheBudgetGrows => {
                Value::Count(self.elastic.state.grows.load(Ordering::Relaxed))
            }
            Stat::CacheBudgetHolds => {
                Value::Count(self.elastic.state.holds.load(Ordering::Relaxed))
            }
            Stat::CacheBudgetShrinks => {
                Value::Count(self.elastic.state.shrinks.load(Ordering::Relaxed))
            }
            Stat::CacheDroppedFiles => {
                Value::Count(cc.shrink_dropped_files.load(Ordering::Relaxed))
            }
            Stat::CacheFreedBytes => Value::Count(cc.shrink_freed.load(Ordering::Relaxed)),
            Stat::MemoryFree => Value::Count(self.elastic.state.free.load(Ordering::Relaxed)),
            Stat::MemoryPressureEvents => {
                Value::Count(self.elastic.state.pressure_events.load(Ordering::Relaxed))
            }
            Stat::MetadataBytes => {
                Value::Count(self.tree.ns.memory() as u64 + self.tree.source.memory())
            }
            Stat::AdmissionsRefused => Value::Count(cc.refused.load(Ordering::Relaxed)),
            Stat::Evictions => Value::Count(cc.evicted.load(Ordering::Relaxed)),
            Stat::SourceErrors => Value::Count(Counters::get(&c.source_errors)),
            Stat::SourceRequests => Value::Count(Counters::get(&stats.store.requests)),
            Stat::SourceRetried => Value::Count(Counters::get(&stats.store.retried)),
            Stat::SourceThrottled => Value::Count(Counters::get(&stats.store.throttled)),
            Stat::SourceGetsAhead => Value::Count(Counters::get(&stats.store.ahead)),
            Stat::SourceGetsAheadUnused => Value::Count(Counters::get(&stats.store.ahead_unused)),
            Stat::TierErrors => Value::Count(Counters::get(&c.tier_errors)),
            Stat::DiskHits => Value::Count(Counters::get(&c.disk_hits)),
            Stat::BytesFromDisk => Value::Count(Counters::get(&c.bytes_from_disk)),
            Stat::DiskCachedBytes => Value::Count(disk.map_or(0, |d| d.cached_bytes())),
            Stat::DiskCachedBlocks => Value::Count(disk.map_or(0, |d| d.cached_blocks())),
            Stat::DiskIndexBytes => Value::Count(disk.map_or(0, |d| d.index_bytes())),
            Stat::DiskUsed => Value::Count(disk.map_or(0, |d| d.used())),
            Stat::DiskCapacity => Value::Count(disk.map_or(0, |d| d.capacity())),
            Stat::DiskDropped => Value::Count(Counters::get(&c.disk_dropped)),
            Stat::DiskEnabled => Value::Count(u64::from(disk.is_some_and(|d| d.enabled()))),
            Stat::PeerHits => Value::Count(Counters::get(&c.peer_hits)),
            Stat::BytesFromPeers => Value::Count(Counters::get(&c.bytes_from_peers)),
            Stat::PeerErrors => Value::Count(Counters::get(&c.peer_errors)),
            Stat::PeerServed => Value::Count(Counters::get(&c.peer_served)),
            Stat::BytesToPeers => Value::Count(Counters::get(&c.bytes_to_peers)),
            Stat::PeerRefused => Value::Count(Counters::get(&c.peer_refused)),
            Stat::FetchStallSeconds => Value::Ratio(Counters::get(&c.fetch_stall_us) as f64 / 1e6),
            Stat::DataWaitSeconds => Value::Ratio(Counters::get(&c.data_wait_us) as f64 / 1e6),
            Stat::StagingHits => Value::Count(Counters::get(&c.staging_hits)),
            Stat::SharedHits => Value::Count(Counters::get(&c.shared_hits)),
            Stat::SourceReadsPerFile => Value::Ratio(if from_source == 0 {
                0.0
            } else {
                Counters::get(&c.source_file_reads) as f64 / from_source as f64
            }),
            Stat::PrefetchedBlocks => Value::Count(Counters::get(&c.prefetched_blocks)),
            Stat::PrefetchedUnused => Value::Count(Counters::get(&c.prefetched_unused)),
            Stat::ReadaheadBytes => Value::Count(Counters::get(&c.readahead_bytes)),
            Stat::ReadaheadUnusedBytes => Value::Count(Counters::get(&c.readahead_unused_bytes)),
            Stat::KernelReaskedBytes => Value::Count(Counters::get(&c.kernel_reasked_bytes)),
            Stat::SourceRequestsPerGib => {
                let gib = Counters::get(&c.bytes_from_source) as f64 / (1u64 << 30) as f64;
                let requests = Counters::get(&stats.store.requests) as f64;
                Value::Count(if gib > 0.0 {
                    (requests / gib).round() as u64
                } else {
                    0
                })
            }
            Stat::SourceStreamBdpBytes => Value::Count(self.reads.tiers.fetcher.stream_bdp()),
            Stat::StagingBytes => Value::Count(self.reads.prefetcher.staging_bytes()),
            Stat::PrefetchMemory => Value::Count(self.reads.prefetcher.staging_capacity()),
            Stat::KernelCache => Value::Count(u64::from(self.opener.kernel.keeps())),
            Stat::KernelRefills => Value::Count(self.opener.kernel.refills()),
            Stat::Passthrough => Value::Count(u64::from(self.opener.passthrough.open_to_new())),
            Stat::PassthroughOpens => Value::Count(Counters::get(&c.passthrough_opens)),
            Stat::PassthroughSourceOpens => {
                Value::Count(Counters::get(&c.passthrough_source_opens))
            }
            Stat::StreamDirectOpens => Value::Count(Counters::get(&c.stream_direct_opens)),
            Stat::ReadRequests => Value::Count(Counters::get(&c.read_requests)),
            Stat::KernelOpens => Value::Count(self.kernel_opens() as u64),
            Stat::ToldOpens => Value::Count(Counters::get(&c.told_opens)),
            Stat::KernelStores => Value::Count(Counters::get(&c.kernel_stores)),
            Stat::BatchedReads => Value::Count(Counters::get(&c.batched_reads)),
            Stat::HintsAccepted => Value::Count(Counters::get(&c.hints_accepted)),
            Stat::HintsRejected => Value::Count(Counters::get(&c.hints_rejected)),
            Stat::ActiveJobs => Value::Count(self.reads.jobs.live().len() as u64),
            Stat::DatasetFiles => Value::Count(self.tree.scan.files.load(Ordering::Relaxed)),
            Stat::DatasetBytes => Value::Count(self.tree.scan.bytes.load(Ordering::Relaxed)),
            Stat::ScanComplete => {
                Value::Count(self.tree.scan.complete.load(Ordering::Acquire) as u64)
            }
            Stat::Epoch => Value::Count(epoch),
            Stat::UptimeSeconds => Value::Count(stats.now() as u64),
            Stat::Pid => Value::Count(std::process::id() as u64),
            Stat::Transport => Value::Text(stats.transport.name()),
            Stat::KeeperPid => Value::Count(self.daemons().keeper.unwrap_or(0).into()),
            Stat::Resends => Value::Count(u64::from(self.daemons().resends)),
            Stat::DaemonRestarts => Value::Count(self.daemons().restarts.count),
            Stat::DaemonLongestPauseSeconds => Value::Ratio(self.daemons().restarts.longest_pause),
        }
    }

    /// The value of extended attribute `name` of node `ino`.
    pub fn getxattr(&self, ino: NodeId, name: &OsStr) -> Result<Vec<u8>, FsError> {
        if let Some(order) = order::control(ino) {
            return order.getxattr();
        }
        let info = self.tree.ns.info(ino).ok_or(FsError::NotFound)?;
        let name = name.to_str().ok_or(FsError::NoAttr)?;
        if ino == ROOT {
            if name == stats::STATS_XATTR {
                return Ok(self.snapshot().to_json(stats::XATTR_SIZE_MAX).into_bytes());
            }
            if let Some(stat) = stats::stat_of_xattr(name) {
                let value = self.snapshot().get(stat).ok_or(FsError::NoAttr)?;
                return Ok(value.text().into_bytes());
            }
        }
        if let Some(acl) = stats::ACL_XATTRS.iter().find(|a| **a == name) {
            // The kernel evaluates POSIX ACLs itself (FUSE_POSIX_ACL) from these.
            let rel = self.rel_path(ino)?;
            return match self.tree.source.acl(&rel, acl).map_err(source_error)? {
                Some(value) => Ok(value),
                None => Err(FsError::NoAttr),
            };
        }
        if info.attr.kind == Kind::File && name == stats::CACHED_XATTR {
            return Ok(self
                .reads
                .tiers
                .memory
                .cached_bytes_of(&info.version)
                .to_string()
                .into_bytes());
        }
        Err(FsError::NoAttr)
    }

    /// The names of the extended attributes of node `ino`, each followed by a NUL.
    pub fn listxattr(&self, ino: NodeId) -> Result<Vec<u8>, FsError> {
        if let Some(order) = order::control(ino) {
            return Ok(order.listxattr());
        }
        let info = self.tree.ns.info(ino).ok_or(FsError::NotFound)?;
        let mut names: Vec<String> = Vec::new();
        if ino == ROOT {
            names.push(stats::STATS_XATTR.to_string());
            names.extend(Stat::ALL.iter().map(|s| stats::xattr_name(*s)));
        }
        if info.attr.kind == Kind::File {
            names.push(stats::CACHED_XATTR.to_string());
        }
        let mut out = Vec::new();
        for n in names {
            out.extend_from_slice(n.as_bytes());
            out.push(0);
        }
        Ok(out)
    }
}
