//! The cache's guarantees, one test each: verified and bounded reads,
//! nothing outside the directory, temp files and hints within the bound.

use std::os::unix::fs::symlink;
use std::time::Duration;

use super::*;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn key(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

fn any(_: &[u8]) -> bool {
    true
}

#[test]
fn entries_are_verified_on_read_and_bad_ones_deleted() {
    let tmp = tempfile::tempdir().expect("tmp");
    let c = DiskCache::open(tmp.path(), 1 << 20).expect("open");
    let k = key(1);
    rt().block_on(async {
        assert_eq!(c.get(Kind::Blob, &k, Size::Exact(3), any).await, None);
        c.put(Kind::Blob, &k, Bytes::from_static(b"abc")).await;
        let got = c.get(Kind::Blob, &k, Size::Exact(3), |b| b == b"abc").await;
        assert_eq!(got.as_deref(), Some(&b"abc"[..]));
        // a check that fails: deleted, and a miss from then on
        assert_eq!(c.get(Kind::Blob, &k, Size::Exact(3), |_| false).await, None);
        assert!(!tmp.path().join("v1/blob").join(&k).exists());
        assert_eq!(c.get(Kind::Blob, &k, Size::Exact(3), any).await, None);
    });
    let s = c.stats();
    assert_eq!((s.hits, s.corrupt, s.misses), (1, 1, 2));
    assert_eq!(s.bytes_written, 3);
}

#[test]
fn eviction_keeps_the_bound_and_drops_the_oldest() {
    let tmp = tempfile::tempdir().expect("tmp");
    let c = DiskCache::open(tmp.path(), 2500).expect("open");
    let root = key(7);
    rt().block_on(async {
        for i in 0..5u8 {
            let k = format!("{root}/{i}");
            c.put(Kind::Row, &k, Bytes::from(vec![i; 1000])).await;
            // distinct modification times, oldest first
            let p = tmp.path().join("v1/rows").join(&k);
            let f = std::fs::File::options()
                .write(true)
                .open(&p)
                .expect("entry");
            f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(100 + u64::from(i)))
                .expect("mtime");
        }
        c.put(Kind::Blob, &key(9), Bytes::from(vec![9; 100])).await;
    });
    let left: u64 = entries(&tmp.path().join("v1")).iter().map(|e| e.1).sum();
    assert!(left <= 2500, "{left}");
    assert!(tmp.path().join("v1/blob").join(key(9)).exists());
    assert!(
        !tmp.path().join(format!("v1/rows/{root}/0")).exists(),
        "oldest first"
    );
    assert!(c.stats().evicted >= 3);
}

/// Issue 35, item 1: a key that is a path never reaches a file outside
/// the cache, neither to read nor to delete nor to write.
#[test]
fn keys_that_are_paths_touch_nothing_outside() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cache = tmp.path().join("cache");
    let victim = tmp.path().join("victim.txt");
    std::fs::write(&victim, b"keep me").expect("victim");
    let c = DiskCache::open(&cache, 1 << 20).expect("open");
    rt().block_on(async {
        for k in ["../../victim.txt", "../../../victim.txt", "/etc/passwd"] {
            for kind in KINDS {
                assert_eq!(c.get(kind, k, Size::AtMost(1 << 20), |_| false).await, None);
                c.put(kind, k, Bytes::from_static(b"overwrite")).await;
                assert!(!c.contains(kind, k));
            }
        }
    });
    assert_eq!(std::fs::read(&victim).expect("still there"), b"keep me");
    assert_eq!(c.stats().bytes_written, 0);
}

/// Issue 35, item 2: a link to a large file, a link to /dev/zero, a FIFO
/// and a file of the wrong length are refused without being read, and
/// removed (the link itself, never its target).
#[test]
fn reads_are_bounded_and_never_follow_links_or_block() {
    let tmp = tempfile::tempdir().expect("tmp");
    let c = DiskCache::open(tmp.path(), 1 << 30).expect("open");
    let big = tmp.path().join("big");
    let f = std::fs::File::create(&big).expect("big");
    f.set_len(2 << 30).expect("a sparse 2 GiB file");
    let dir = tmp.path().join("v1/rows").join(key(3));
    std::fs::create_dir_all(&dir).expect("rows dir");
    symlink(&big, dir.join("1")).expect("link");
    symlink("/dev/zero", dir.join("2")).expect("link");
    let fifo = dir.join("3");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    std::fs::write(dir.join("4"), vec![0u8; 545]).expect("a row one byte long");
    let t = std::time::Instant::now();
    rt().block_on(async {
        for row in 1..=4 {
            let k = format!("{}/{row}", key(3));
            assert_eq!(
                c.get(Kind::Row, &k, Size::Exact(544), any).await,
                None,
                "{row}"
            );
            assert!(!dir.join(row.to_string()).exists(), "{row} removed");
        }
    });
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "nothing blocked or read 2 GiB"
    );
    assert_eq!(std::fs::metadata(&big).expect("target kept").len(), 2 << 30);
    assert_eq!(c.stats().corrupt, 4);
}

/// Issue 35, item 10: a directory standing where an entry belongs is
/// removed and the entry written in its place.
#[test]
fn a_directory_in_an_entrys_place_is_repaired() {
    let tmp = tempfile::tempdir().expect("tmp");
    let c = DiskCache::open(tmp.path(), 1 << 20).expect("open");
    let k = key(4);
    let at = tmp.path().join("v1/blob").join(&k);
    std::fs::create_dir_all(at.join("inner")).expect("a directory");
    rt().block_on(async {
        assert_eq!(c.get(Kind::Blob, &k, Size::Exact(3), any).await, None);
        std::fs::create_dir_all(at.join("inner")).expect("again");
        c.put(Kind::Blob, &k, Bytes::from_static(b"abc")).await;
        let got = c.get(Kind::Blob, &k, Size::Exact(3), any).await;
        assert_eq!(got.as_deref(), Some(&b"abc"[..]));
    });
}

/// A small tmpfs, unmounted on drop (the tests run as root, as CI does).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).expect("mount point");
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status();
        assert!(
            ok.is_ok_and(|s| s.success()),
            "this test needs to mount a small tmpfs (run as root, as CI does)"
        );
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Issue 35, items 4 and 10, on a real full disk: a write that fails
/// leaves no temp file, and the other rows of the same fetch are still
/// written.
#[test]
fn a_full_disk_leaves_no_temp_file_and_loses_no_other_row() {
    let tmp = tempfile::tempdir().expect("tmp");
    let _disk = Tmpfs::mount(&tmp.path().join("small"), "64k");
    let c = DiskCache::open(&tmp.path().join("small"), 1 << 30).expect("open");
    let root = key(5);
    let items = vec![
        (format!("{root}/1"), Bytes::from(vec![1u8; 1 << 20])),
        (format!("{root}/2"), Bytes::from_static(b"two")),
    ];
    rt().block_on(c.put_many(Kind::Row, items));
    let left = std::fs::read_dir(tmp.path().join("small/v1/tmp"))
        .expect("tmp dir")
        .count();
    assert_eq!(left, 0, "the failed write's temp file is gone");
    assert!(!c.contains(Kind::Row, &format!("{root}/1")));
    assert!(
        c.contains(Kind::Row, &format!("{root}/2")),
        "written anyway"
    );
    assert_eq!(c.stats().bytes_written, 3);
}

/// Issue 35, item 4: temp files of dead writers (and old ones) are swept
/// at open and counted against the bound until then.
#[test]
fn stale_temp_files_are_swept_and_counted() {
    let tmp = tempfile::tempdir().expect("tmp");
    drop(DiskCache::open(tmp.path(), 1 << 20).expect("open"));
    let t = tmp.path().join("v1/tmp");
    // what kill -9 mid-write leaves: a writer that no longer exists
    std::fs::write(t.join("blob.4194304.1"), vec![0u8; 3 << 20]).expect("dead writer");
    // a live writer's file (ours), recent: kept
    let live = t.join(entry::tmp_name("blob", 99));
    std::fs::write(&live, b"writing").expect("live writer");
    // a live pid but two hours old: stale
    let old = t.join(entry::tmp_name("blob", 98));
    std::fs::write(&old, b"old").expect("old");
    std::fs::File::options()
        .write(true)
        .open(&old)
        .and_then(|f| f.set_modified(SystemTime::now() - Duration::from_secs(7200)))
        .expect("mtime");
    let c = DiskCache::open(tmp.path(), 1 << 20).expect("reopen");
    assert!(!t.join("blob.4194304.1").exists());
    assert!(!old.exists());
    assert!(live.exists());
    assert_eq!(c.stats().evicted, 2);
    assert_eq!(
        c.total.load(Ordering::Relaxed),
        7,
        "the live temp file counts"
    );
}

/// Issue 35, item 5: hints count against the bound and are evicted like
/// any entry.
#[test]
fn hints_are_counted_and_evicted() {
    let tmp = tempfile::tempdir().expect("tmp");
    let c = DiskCache::open(tmp.path(), 0).expect("open");
    rt().block_on(async {
        for i in 0..100u8 {
            c.put(Kind::Hint, &key(i), Bytes::from_static(&[1; 8]))
                .await;
        }
    });
    let hints = std::fs::read_dir(tmp.path().join("v1/hint"))
        .expect("hint dir")
        .count();
    assert_eq!(hints, 0, "a bound of 0 keeps no hint");
}

/// Issue 35, item 3: a cache directory that cannot be written is refused
/// at open (the caller then warns or fails).
#[test]
fn an_unwritable_directory_is_refused_at_open() {
    let tmp = tempfile::tempdir().expect("tmp");
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"").expect("file");
    assert!(DiskCache::open(&file, 1 << 20).is_err());
}
