//! Bad database files at start: the binary refuses to start with one line on stderr naming the
//! file and the problem, and leaves the file (and its WAL) exactly as it found them.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::SystemTime;

use ctxd::store::Config;

use super::*;

const PAGE: usize = 4096;

/// The bytes and mtime of a file, or `None` when there is none.
type Snapshot = Option<(Vec<u8>, SystemTime)>;

fn snapshot(path: &Path) -> Snapshot {
    let meta = std::fs::metadata(path).ok()?;
    Some((
        std::fs::read(path).expect("read"),
        meta.modified().expect("mtime"),
    ))
}

fn wal(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// A sound database with a session of a few messages, its WAL checkpointed into the file.
async fn sound_database() -> (tempfile::TempDir, PathBuf, String) {
    let mut served = serve_config(Config::default()).await;
    let session = fill_session(&mut served.client).await;
    let (dir, db) = served.stop().await;
    assert!(!wal(&db).exists(), "a clean close leaves no WAL");
    (dir, db, session)
}

async fn fill_session(client: &mut Client) -> String {
    let session = new_session(client).await;
    for i in 0..4 {
        client
            .append(append_req(
                &session,
                vec![
                    user(&big_text(6000, &format!("q{i}"))),
                    assistant(&format!("a{i}")),
                ],
            ))
            .await
            .expect("Append");
    }
    session
}

/// Runs `ctxd serve` on `db` and asserts the refusal: a non-zero exit, nothing on stdout, one
/// line on stderr naming `named` and saying `problem`, and `db` and its WAL untouched.
async fn assert_refused(db: &Path, named: &Path, problem: &str) {
    let before = (snapshot(db), snapshot(&wal(db)));
    let refusal = run_to_exit(Serve::new(db).command()).await;
    assert!(!refusal.status.success(), "stderr: {}", refusal.stderr);
    assert_eq!(refusal.stdout, "", "it never reported an address");
    let lines: Vec<&str> = refusal.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {:?}", refusal.stderr);
    let expected = format!("ctxd: {}: ", named.display());
    assert!(
        lines[0].starts_with(&expected),
        "{:?} starts with {expected:?}",
        lines[0]
    );
    assert!(
        lines[0].contains(problem),
        "{:?} says {problem:?}",
        lines[0]
    );
    assert!(
        before == (snapshot(db), snapshot(&wal(db))),
        "the database and its WAL are unchanged, bytes and mtime"
    );
}

#[tokio::test]
async fn an_empty_file_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    File::create(&db).expect("create");
    assert_refused(&db, &db, "is empty (0 bytes)").await;
}

#[tokio::test]
async fn a_file_cut_inside_a_page_is_refused() {
    let (_dir, db, _) = sound_database().await;
    let bytes = std::fs::read(&db).expect("read");
    std::fs::write(&db, &bytes[..bytes.len() - 1000]).expect("truncate");
    assert_refused(&db, &db, "truncated").await;
}

#[tokio::test]
async fn a_file_shorter_than_its_header_says_is_refused() {
    let (_dir, db, _) = sound_database().await;
    let bytes = std::fs::read(&db).expect("read");
    assert!(bytes.len() > 4 * PAGE, "{} bytes", bytes.len());
    std::fs::write(&db, &bytes[..2 * PAGE]).expect("truncate");
    assert_refused(&db, &db, "but its header counts").await;
}

#[tokio::test]
async fn a_zeroed_header_is_refused() {
    let (_dir, db, _) = sound_database().await;
    let mut bytes = std::fs::read(&db).expect("read");
    bytes[..100].fill(0);
    std::fs::write(&db, &bytes).expect("write");
    assert_refused(&db, &db, "header is zeroed").await;
}

#[tokio::test]
async fn a_garbage_file_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    std::fs::write(&db, noise(3 * PAGE, 7)).expect("write");
    assert_refused(&db, &db, "not a SQLite database (bad header)").await;
}

#[tokio::test]
async fn a_garbage_wal_is_refused() {
    let (_dir, db, _) = sound_database().await;
    std::fs::write(wal(&db), noise(PAGE + 32, 3)).expect("write the WAL");
    assert_refused(&db, &wal(&db), "not a SQLite WAL").await;
}

/// A copy of a live database: the file and a WAL holding its newest transactions.
async fn database_with_a_live_wal() -> (tempfile::TempDir, PathBuf, String) {
    let mut served = serve_config(Config::default()).await;
    let session = fill_session(&mut served.client).await;
    let copy = tempfile::tempdir().expect("temp dir");
    let db = copy.path().join("ctxd.db");
    // Nothing writes now, so the file and its WAL are a consistent pair.
    std::fs::copy(&served.db, &db).expect("copy the database");
    std::fs::copy(wal(&served.db), wal(&db)).expect("copy the WAL");
    served.stop().await;
    assert!(std::fs::metadata(wal(&db)).expect("WAL").len() > 32);
    (copy, db, session)
}

#[tokio::test]
async fn a_wal_with_a_bad_header_checksum_is_refused() {
    let (_dir, db, _) = database_with_a_live_wal().await;
    let mut bytes = std::fs::read(wal(&db)).expect("read the WAL");
    bytes[16] ^= 0xff; // the first salt, covered by the header checksum
    std::fs::write(wal(&db), &bytes).expect("write the WAL");
    assert_refused(&db, &wal(&db), "bad header checksum").await;
}

/// The checks accept what SQLite left after a crash: a WAL holding the newest transactions.
#[tokio::test]
async fn a_live_wal_is_recovered_not_refused() {
    let (_dir, db, session) = database_with_a_live_wal().await;
    let daemon = Daemon::start(&db, &[]).await;
    let mut client = connect(daemon.addr).await;
    let rendered = client
        .render(render_req(&session, Target::Branch("main".into())))
        .await
        .expect("Render")
        .into_inner();
    assert_eq!(
        rendered.messages.len(),
        8,
        "every message, read through the WAL"
    );
    drop(client);
    daemon.stop().await;
    assert_eq!(integrity(&db).await, "ok");
}

#[tokio::test]
async fn a_wal_without_its_database_is_refused() {
    let (_dir, db, _) = database_with_a_live_wal().await;
    std::fs::remove_file(&db).expect("remove the database");
    assert_refused(&db, &wal(&db), "a WAL without its database").await;
    assert!(!db.exists(), "no empty database was created beside it");
}

#[tokio::test]
async fn a_read_only_file_is_refused() {
    let (_dir, db, _) = sound_database().await;
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    assert_refused(&db, &db, "is read-only").await;
}

#[tokio::test]
async fn a_read_only_directory_is_refused() {
    let (dir, db, _) = sound_database().await;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).expect("chmod");
    assert_refused(&db, dir.path(), "directory is read-only").await;
    // Writable again, so the temp dir can be removed.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A damaged b-tree page under a sound header: `PRAGMA quick_check` finds it before the server
/// binds its port.
#[tokio::test]
async fn a_database_failing_quick_check_is_refused() {
    let (_dir, db, _) = sound_database().await;
    let root: i64 = {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .immutable(true);
        let pool = sqlx::SqlitePool::connect_with(options).await.expect("open");
        let root = sqlx::query_scalar("SELECT rootpage FROM sqlite_schema WHERE name = 'nodes'")
            .fetch_one(&pool)
            .await
            .expect("the nodes table");
        pool.close().await;
        root
    };
    let mut bytes = std::fs::read(&db).expect("read");
    let page = usize::try_from(root - 1).expect("a page number") * PAGE;
    bytes[page..page + PAGE].fill(0);
    std::fs::write(&db, &bytes).expect("write");
    assert_refused(&db, &db, "fails PRAGMA quick_check").await;
}
