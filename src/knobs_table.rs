// The one table of every AGENTFS_* knob.
//
// This file is data only. `src/knobs.rs` turns it into the typed `Knobs` struct that the
// program reads, and `build.rs` turns it into KNOBS.md. Each row:
//   field: Type = default, [min, max], Kind, "AGENTFS_NAME", "meaning";
// Type is Bool, U64 or Str; for Str the range is unused. Kind is Policy or KillSwitch.
knob_table! {
    fuse_max_write: U64 = 1048576, [4096, 16777216], Policy, "AGENTFS_FUSE_MAX_WRITE",
        "Largest WRITE payload offered to the kernel in bytes; max_pages is derived from it (max_write / 4096).";
    fuse_readdirplus: Bool = true, [0, 1], KillSwitch, "AGENTFS_FUSE_READDIRPLUS",
        "Offer READDIRPLUS so a directory listing also returns attributes and entries (0 = plain READDIR only).";
    fuse_writeback_cache: Bool = false, [0, 1], Policy, "AGENTFS_FUSE_WRITEBACK_CACHE",
        "Let the kernel buffer writes in the page cache and send them in large batches (0 = write-through, every write(2) one WRITE). Off by default: with it on, every close(2) makes the kernel forget the file's st_blocks, so the next stat of each file is a round trip; measured side by side (kernel-notes/fuse-server-facts.md) write-through gave stat after create 13x, unlink 1.6x, small files written 1.6x, create 1.35x and sequential writes 1.3x, and costs 4 KiB random writes 0.64x (the kernel no longer merges them).";
    fuse_readahead_kib: U64 = 1024, [0, 65536], Policy, "AGENTFS_FUSE_READAHEAD_KIB",
        "Kernel readahead of the mount in KiB, written to /sys/class/bdi after INIT (root only); the kernel's 128 KiB default also caps every READ at 128 KiB. 0 leaves the kernel's value.";
    fuse_threads: U64 = 2, [1, 64], Policy, "AGENTFS_FUSE_THREADS",
        "Threads reading requests from /dev/fuse; each has its own SQLite read connection. Why 2: one thread was not faster for a single-threaded client (alternating rounds of create, unlink and rm -rf, kernel-notes/profiling.md), and a second lets one request wait for the writer while another is served.";
    fuse_uring: Bool = true, [0, 1], KillSwitch, "AGENTFS_FUSE_URING",
        "Serve requests over FUSE-over-io_uring when the kernel offers it (enable_uring=Y); /dev/fuse stays the fallback.";
    fuse_forget_pause_us: U64 = 2000, [0, 100000], Policy, "AGENTFS_FUSE_FORGET_PAUSE_US",
        "While the ring serves requests, how long a /dev/fuse thread waits after a FORGET before it reads again, so the kernel hands the forgets that arrive meanwhile over as one BATCH_FORGET (0 = read again at once).";
    fuse_spin_us: U64 = 50, [0, 10000], Policy, "AGENTFS_FUSE_SPIN_US",
        "When /dev/fuse serves the requests (no ring): after a request, one transport thread polls this long (in microseconds, yielding between polls) for the next one before it sleeps in read(2), as long as requests keep coming that fast, so a back-to-back caller's request is read without a thread wake-up (0 = always sleep). Why 50: on 2 CPUs, in alternating rounds against 0, small files written 1.6-1.8x, unlink 1.2-1.3x, create 1.1-1.5x, rm -rf 1.0-1.2x, one request 6.5-6.8 us instead of 18-30, one client thread's metadata cycles 1.1-1.5x; two client threads level, four 0.9x; git add + commit 0.86-0.97x (git computes between its requests, and the poll waits in vain); the server's CPU 15-30% more while requests stream (kernel-notes/profiling.md). 10 and 20 gained less, 100 and 300 no more.";
    fuse_uring_depth: U64 = 8, [1, 256], Policy, "AGENTFS_FUSE_URING_DEPTH",
        "Most ring entries per queue (one queue per possible CPU); each entry holds a max_write-sized buffer, so the depth used is what the transport's quarter of AGENTFS_MEMORY_BUDGET_MIB holds (at least 1, at most this).";
    fuse_noopen: Bool = true, [0, 1], KillSwitch, "AGENTFS_FUSE_NOOPEN",
        "Answer OPEN with ENOSYS so the kernel stops sending it (and RELEASE) for files; no state is keyed to open files.";
    fuse_noopendir: Bool = true, [0, 1], KillSwitch, "AGENTFS_FUSE_NOOPENDIR",
        "Answer OPENDIR with ENOSYS so the kernel opens directories without asking and serves repeated listings from its own cache (FOPEN_CACHE_DIR), which the server guards against stale fills (0 = OPENDIR answered, every listing a request).";
    fuse_noflush: Bool = true, [0, 1], KillSwitch, "AGENTFS_FUSE_NOFLUSH",
        "Answer FLUSH with ENOSYS so close(2) costs no request; the kernel still writes dirty pages back before close returns.";
    fuse_killpriv_v2: Bool = true, [0, 1], KillSwitch, "AGENTFS_FUSE_KILLPRIV_V2",
        "Clear set-id bits on write, truncate and chown in the server (FUSE_HANDLE_KILLPRIV_V2), so the kernel stops asking for security.capability before every write(2) (0 = the kernel does it all).";
    fuse_workers: U64 = 4, [0, 64], Policy, "AGENTFS_FUSE_WORKERS",
        "Worker threads, one per inode shard: they run a mutation when its shard is busy or the transport thread that read it cannot wait for it (no other /dev/fuse thread left free, or a barrier on a ring); 0 runs every request on the transport thread that read it.";
    fuse_parallel_dirops: Bool = true, [0, 1], KillSwitch, "AGENTFS_FUSE_PARALLEL_DIROPS",
        "Let the kernel send lookups and readdirs of one directory concurrently (0 = it serialises them per directory).";
    fuse_keep_cache: Bool = true, [0, 1], KillSwitch, "AGENTFS_FUSE_KEEP_CACHE",
        "With classic opens (AGENTFS_FUSE_NOOPEN=0): keep a file's page cache across opens (FOPEN_KEEP_CACHE). Zero-message opens always keep it.";
    fuse_entry_ttl_ms: U64 = 60000, [0, 3600000], Policy, "AGENTFS_FUSE_ENTRY_TTL_MS",
        "How long the kernel may cache a name lookup (positive entries), in milliseconds. Long, because the server is the database's only writer and tells the kernel about every change made behind the mount (AGENTFS_EXTERNAL_POLL_MS); capped by AGENTFS_FUSE_BASE_TTL_MS over a base directory and on kernels older than FUSE 7.44 (no way to make them revalidate every name).";
    fuse_attr_ttl_ms: U64 = 60000, [0, 3600000], Policy, "AGENTFS_FUSE_ATTR_TTL_MS",
        "How long the kernel may cache attributes, in milliseconds (capped by AGENTFS_FUSE_BASE_TTL_MS over a base directory).";
    fuse_base_ttl_ms: U64 = 1000, [0, 3600000], Policy, "AGENTFS_FUSE_BASE_TTL_MS",
        "Overlay mounts (a base directory under the delta): the most the kernel may cache names and attributes, in milliseconds, since changes made to the base directory directly are not watched.";
    fuse_negative_ttl_ms: U64 = 0, [0, 3600000], Policy, "AGENTFS_FUSE_NEGATIVE_TTL_MS",
        "How long the kernel may cache a failed lookup, in milliseconds (0 = never).";
    fuse_ino_files_cap: U64 = 256, [1, 65536], Policy, "AGENTFS_FUSE_INO_FILES_CAP",
        "Overlay mounts: most base-layer files kept open for reading (an LRU keyed by node); the least recently read is closed first.";
    sqlite_cache_kib: U64 = 16384, [256, 4194304], Policy, "AGENTFS_SQLITE_CACHE_KIB",
        "Most SQLite page cache of one connection, in KiB; all connections together stay within SQLite's quarter of AGENTFS_MEMORY_BUDGET_MIB, which also caps each one.";
    sqlite_busy_timeout_ms: U64 = 5000, [0, 600000], Policy, "AGENTFS_SQLITE_BUSY_TIMEOUT_MS",
        "How long a connection waits for a lock held by another process (e.g. an offline `agentfs fs` write).";
    wal_checkpoint_pages: U64 = 16000, [0, 1000000], Policy, "AGENTFS_WAL_CHECKPOINT_PAGES",
        "WAL pages (4 KiB each) after which a thread of the server folds the WAL into the database (a PASSIVE checkpoint on its own connection), off the commit path; at 4 times as many the committing writer checkpoints itself (the WAL starts over only after a checkpoint that finished before a write began, so this bounds it: 64 MiB and 256 MiB by default; at rest the file goes back to the threshold). 0 = SQLite's own checkpoint at 1000 pages, on the commit path. Why 16000: a 256 MiB write + fsync ran 1.7x faster than at 1000 (every fourth MiB no longer stalls the writer in a checkpoint), measured side by side in kernel-notes/profiling.md. A replicated database's checkpoints are Litestream's (AGENTFS_REPLICA_LEAVE_CHECKPOINTS).";
    wal_writeback_kib: U64 = 4096, [0, 1048576], Policy, "AGENTFS_WAL_WRITEBACK_KIB",
        "Each time the WAL has grown by this many KiB, the checkpoint thread starts the disk writes of its new pages without waiting (sync_file_range), so the barrier's fdatasync after a long write finds little left to write (0 = the pages wait for the barrier or the checkpoint). Needs the checkpoint thread (AGENTFS_WAL_CHECKPOINT_PAGES > 0).";
    wal_gather: Bool = true, [0, 1], KillSwitch, "AGENTFS_WAL_GATHER",
        "Gather the server's WAL writes into one write(2) per committed transaction (at most 124 KiB each) instead of SQLite's two per 4 KiB page (a frame header, then the page); every committed frame is in the file before the commit is published to other connections. Its checkpoints likewise read the WAL ahead and write the database file in runs of up to 124 KiB instead of one read and one write per page, while the space guard sees room (0 = SQLite writes each frame and copies each page itself).";
    batch: Bool = true, [0, 1], KillSwitch, "AGENTFS_BATCH",
        "Batch writes: acknowledge from memory, commit many inodes per transaction (0 = one SQLite transaction per WRITE).";
    batch_window_ms: U64 = 5, [0, 3600000], Policy, "AGENTFS_BATCH_WINDOW_MS",
        "Group-commit timer: pending bytes are committed at most this long after an inode's first pending write, and a namespace batch transaction at most this long after it opened, in milliseconds.";
    batch_inode_trigger_kib: U64 = 8192, [4, 1048576], Policy, "AGENTFS_BATCH_INODE_TRIGGER_KIB",
        "Commit an inode at once (without waiting for the window) when it has this many KiB pending.";
    batch_max_pending_mib: U64 = 256, [1, 65536], Policy, "AGENTFS_BATCH_MAX_PENDING_MIB",
        "Global cap on acknowledged-but-uncommitted bytes, in MiB, within the batches' quarter of AGENTFS_MEMORY_BUDGET_MIB (the smaller applies); writers wait (back-pressure) when it is reached, commits start at half of it.";
    batch_txn_inodes: U64 = 1024, [1, 1000000], Policy, "AGENTFS_BATCH_TXN_INODES",
        "Most inodes one group-commit transaction takes.";
    batch_txn_kib: U64 = 32768, [64, 4194304], Policy, "AGENTFS_BATCH_TXN_KIB",
        "Bytes one group-commit transaction takes, in KiB (an inode with more is committed lowest offsets first over several).";
    batch_namespace: Bool = true, [0, 1], KillSwitch, "AGENTFS_BATCH_NAMESPACE",
        "Group-commit namespace operations: one SQLite transaction stays open across many operations (each a savepoint) and commits after AGENTFS_BATCH_WINDOW_MS, after AGENTFS_BATCH_NAMESPACE_OPS operations or at a barrier (0 = one transaction per operation).";
    batch_namespace_ops: U64 = 1024, [1, 1000000], Policy, "AGENTFS_BATCH_NAMESPACE_OPS",
        "Most operations one namespace batch transaction holds before it commits.";
    batch_namespace_gap_ms: U64 = 1, [0, 60000], Policy, "AGENTFS_BATCH_NAMESPACE_GAP_MS",
        "After a namespace batch commits, operations commit one by one for this long before the next batch opens, so other processes' writers (offline agentfs commands) get the write lock under continuous load, in milliseconds.";
    batch_unlink_queue: U64 = 256, [0, 65536], Policy, "AGENTFS_BATCH_UNLINK_QUEUE",
        "Most unlinks and rmdirs acknowledged before their statements run (from the caches, when they know the name's inode, its link count and that it has no pending bytes, or that the directory is empty); the flusher runs them on another CPU, in order, before anything else touches the database (0 = every unlink and rmdir runs before its reply).";
    durability_window_ms: U64 = 5000, [0, 3600000], Policy, "AGENTFS_DURABILITY_WINDOW_MS",
        "Committed work is made durable (an fdatasync of the -wal) at most this long after the first commit no barrier covered, like ext4's commit=5, in milliseconds (0 = only barriers make it durable).";
    space_reserve_mib: U64 = 4, [0, 65536], Policy, "AGENTFS_SPACE_RESERVE_MIB",
        "Free space on the database's filesystem kept for operations that free space (unlink, rmdir, rename, truncate, punch hole, removexattr): an operation that grows the database fails with ENOSPC up front rather than take it, in MiB.";
    space_low_mib: U64 = 64, [0, 1048576], Policy, "AGENTFS_SPACE_LOW_MIB",
        "Below this much free space above the reserve, nothing is acknowledged before it is committed: namespace operations commit before their reply and WRITEs go through, so a full disk fails the operation that filled it, in MiB.";
    space_sample_ms: U64 = 100, [1, 60000], Policy, "AGENTFS_SPACE_SAMPLE_MS",
        "How old the free-space figures (statvfs of the database's directory, SQLite's free pages) may be before an operation samples them again, in milliseconds.";
    vacuum_free_percent: U64 = 10, [1, 100], Policy, "AGENTFS_VACUUM_FREE_PERCENT",
        "When free pages are at least this share of the database file, an idle server (and every clean unmount) returns them to the filesystem with incremental vacuum steps, in percent.";
    vacuum_step_pages: U64 = 4096, [1, 1048576], Policy, "AGENTFS_VACUUM_STEP_PAGES",
        "Most free pages one idle vacuum step returns (the writer is held for the step).";
    cache: Bool = true, [0, 1], KillSwitch, "AGENTFS_CACHE",
        "Server-side caches of attributes, name lookups and directory listings, keyed by inode (0 = every request reads SQLite).";
    memory_budget_mib: U64 = 64, [4, 1048576], Policy, "AGENTFS_MEMORY_BUDGET_MIB",
        "Memory one server's caches and buffers share, in MiB, in four equal parts: SQLite's page caches (all connections together), the attribute, lookup and listing caches (in bytes; this replaces the former entry counts AGENTFS_CACHE_ATTR_CAP, AGENTFS_CACHE_LOOKUP_CAP and AGENTFS_CACHE_READDIR_CAP), pending WRITE data (and the kernel's background requests, each a possible 1 MiB copy), and request buffers (ring depth). Why 64: each 16 MiB part holds a 1 MiB-write ring of depth 6 on 2 CPUs, 16 writeback WRITEs in flight, and a 60 MiB source tree's metadata; a server then ends a workload suite near 40 MiB resident and sixteen stay under 1 GiB; the process adds a fixed overhead of about 8-16 MiB beyond it (see `agentfs status`).";
    memory_idle_ms: U64 = 10000, [100, 86400000], Policy, "AGENTFS_MEMORY_IDLE_MS",
        "After this long without a request, a server shrinks its caches to an eighth of their part, closes idle SQLite read connections and returns freed memory to the system (malloc_trim), in milliseconds; the next requests refill them.";
    external_poll_ms: U64 = 250, [0, 600000], Policy, "AGENTFS_EXTERNAL_POLL_MS",
        "How often a mounted server checks whether another process committed to the database (then it drops its caches and tells the kernel), in milliseconds (0 = never).";
    mount_quick_check: Bool = true, [0, 1], KillSwitch, "AGENTFS_MOUNT_QUICK_CHECK",
        "Before a read-write mount, run SQLite's PRAGMA quick_check and refuse a database whose pages are damaged (db_corrupt; -o ro still mounts it to copy files out).";
    mount_quick_check_ms: U64 = 2000, [1, 3600000], Policy, "AGENTFS_MOUNT_QUICK_CHECK_MS",
        "Most time the mount's quick check may take, in milliseconds; a database too large to finish in it is mounted after a warning that only part of it was checked (agentfs integrity checks it all).";
    checkpoint_idle_ms: U64 = 5000, [0, 86400000], Policy, "AGENTFS_CHECKPOINT_IDLE_MS",
        "A running sandbox's watcher takes a checkpoint (a snapshot of kind checkpoint) once the project's delta has had no commit for this long after a change, in milliseconds (0 = no automatic checkpoints; `agentfs checkpoint` still works).";
    checkpoint_max_s: U64 = 90, [0, 86400], Policy, "AGENTFS_CHECKPOINT_MAX_S",
        "Ceiling of automatic checkpoints: while writes never pause, a checkpoint is still taken once the oldest change not in a checkpoint is this old (as the watcher first saw it), in seconds (0 = no ceiling: only pauses trigger).";
    checkpoint_keep: U64 = 20, [0, 1000000], Policy, "AGENTFS_CHECKPOINT_KEEP",
        "Retention: the newest this many checkpoints of the history keep their state; older ones keep it only when they are the newest checkpoint of their hour, the rest are pruned (their commit stays, gc may then delete what only they reached). Manual, exit and restore commits are never pruned (0 = prune nothing).";
    checkpoint_freeze: Str = "auto", [0, 0], Policy, "AGENTFS_CHECKPOINT_FREEZE",
        "Freeze the sandbox's processes (cgroup v2 freezer) while a checkpoint is taken: auto (freeze when a cgroup can be made, else run with unfrozen checkpoints, said at launch and in the run record), require (refuse to launch without one: freezer_unavailable) or off (never freeze).";
    mount_backend: Str = "auto", [0, 0], Policy, "AGENTFS_MOUNT_BACKEND",
        "The backend a project gets at its first launch when --mount-backend is not given: auto (the first of FUSE and overlayfs that mounts in a throwaway namespace), fuse or overlayfs. A project keeps the backend its config.toml records whatever this says.";
    audit_max_events: U64 = 1000, [1, 10000000], Policy, "AGENTFS_AUDIT_MAX_EVENTS",
        "Most escape attempts one sandbox run appends to its project's audit log (audit/events.ndjson); past it writes are still refused, unlogged, and the run ends the log with one line counting them.";
    checkpoint_freeze_wait_ms: U64 = 2000, [1, 600000], Policy, "AGENTFS_CHECKPOINT_FREEZE_WAIT_MS",
        "Most time a checkpoint waits for the kernel to report the sandbox frozen; past it the sandbox is thawed and the checkpoint is taken unfrozen (recorded in its message), in milliseconds.";
    checkpoint_nice: U64 = 10, [0, 19], Policy, "AGENTFS_CHECKPOINT_NICE",
        "Nice value of a checkpoint's walk once the sandbox is thawed (the freeze and the snapshot's first read run at the server's priority), so that hashing and compressing yield to the sandbox's own work; 0 = the server's priority. It orders threads within one session's autogroup, which the sandbox shares with its server.";
    log: Str = "warn", [0, 0], Policy, "AGENTFS_LOG",
        "Log filter for the server (tracing env-filter syntax, e.g. info or agentfs=debug); offline commands log only when it is set to another filter than this default.";
    fault_commit: Str = "", [0, 0], Policy, "AGENTFS_FAULT_COMMIT",
        "Tests only: while the file this names exists, every COMMIT of the server fails with EIO and is rolled back, as a failing disk would make it (empty = off).";
    fault_panic: Str = "", [0, 0], Policy, "AGENTFS_FAULT_PANIC",
        "Tests only: the server panics while handling a request whose opcode (e.g. FUSE_MKDIR or mkdir) or entry name equals this value, to prove a panic is answered with EIO and serving goes on (empty = never).";
    apply_stop_after: U64 = 0, [0, 1000000000], Policy, "AGENTFS_APPLY_STOP_AFTER",
        "Tests only: `agentfs apply` stops itself (SIGSTOP) once this many of its steps have run, before the next one, so a test can kill it halfway at a known point (0 = never).";
    projects_dir: Str = "", [0, 0], Policy, "AGENTFS_PROJECTS_DIR",
        "Directory holding one directory per project (delta.db, config.toml, runs/) and defaults.toml (empty = ~/.agentfs).";
    litestream: Str = "", [0, 0], Policy, "AGENTFS_LITESTREAM",
        "The Litestream 0.5 executable replication and restore-replica run (empty = the first litestream on PATH).";
    replica_sync_ms: U64 = 1000, [10, 3600000], Policy, "AGENTFS_REPLICA_SYNC_MS",
        "How often Litestream ships a replicated database's new WAL frames to the replica (its sync-interval), in milliseconds.";
    replica_stop_wait_ms: U64 = 30000, [100, 3600000], Policy, "AGENTFS_REPLICA_STOP_WAIT_MS",
        "When a replication ends (replicate stopped, a mount unmounted, a sandbox's command exited): the most time Litestream gets to exit after SIGTERM, and then its last pass (litestream replicate -once) to bring the replica up to the final barrier, each, in milliseconds; a pass that takes longer is killed and reported as replica_behind.";
    replica_status_wait_ms: U64 = 5000, [100, 600000], Policy, "AGENTFS_REPLICA_STATUS_WAIT_MS",
        "The most time status gives each question it asks Litestream about a live replication (its local position, the replica's newest file), in milliseconds; past it the question is killed and the position shows why, so an unreachable replica never stalls status.";
    replica_leave_checkpoints: Bool = true, [0, 1], KillSwitch, "AGENTFS_REPLICA_LEAVE_CHECKPOINTS",
        "While a database is replicated, leave WAL checkpoints to Litestream: the server opens it with SQLite's automatic checkpoint off and takes no TRUNCATE checkpoint at unmount or when space runs low (0 = the server checkpoints as usual and Litestream copes).";
    require_litestream: Bool = false, [0, 1], Policy, "AGENTFS_REQUIRE_LITESTREAM",
        "Tests: a missing Litestream or S3 test server is a failure instead of a skip (CI sets 1).";
    require_fuse: Bool = false, [0, 1], Policy, "AGENTFS_REQUIRE_FUSE",
        "Tests: a missing /dev/fuse is a failure instead of a skip (CI sets 1).";
    bench_quick: Bool = false, [0, 1], Policy, "AGENTFS_BENCH_QUICK",
        "Benchmarks: the mount-level benches (workloads, transport) run their quick subset (smaller sizes, under 2 minutes).";
    bench_budgets: Str = "", [0, 0], Policy, "AGENTFS_BENCH_BUDGETS",
        "Benchmarks: the workloads bench adds an AgentFS column per memory budget listed here, in MiB, comma-separated (e.g. 16,256; the plain column runs at the default budget; empty = none).";
    bench_variants: Str = "", [0, 0], Policy, "AGENTFS_BENCH_VARIANTS",
        "Benchmarks: the workloads bench adds an AgentFS column per entry listed here, comma-separated, each one or more NAME=VALUE of knobs separated by ';' that its server runs with (e.g. AGENTFS_WAL_CHECKPOINT_PAGES=0), so a change is measured beside what it replaces in one run (empty = none).";
    bench_passthrough_hp: Str = "", [0, 0], Policy, "AGENTFS_BENCH_PASSTHROUGH_HP",
        "Benchmarks: the libfuse passthrough_hp executable behind the workloads bench's passthrough_hp columns, over /dev/fuse and over io_uring (the second needs libfuse 3.18 or later built with io_uring) (empty = target/bench-tools/passthrough_hp, which benches/workloads/passthrough_hp.sh builds from libfuse's release source; without one the columns say how to get it).";
    bench_sandbox_n: U64 = 30, [1, 100000], Policy, "AGENTFS_BENCH_SANDBOX_N",
        "Benchmarks: launches of each kind the sandbox bench times (median and p99 of these).";
}
