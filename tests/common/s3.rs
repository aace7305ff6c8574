//! Litestream and a local S3 server (moto) from the virtual environment that
//! validation/install-deps.sh makes (target/test-venv), for the replication tests and bench.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Most time moto gets to listen.
const LISTEN_WAIT: Duration = Duration::from_secs(180);

pub fn venv() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv/bin")
}

/// Whether Litestream and moto are installed.
pub fn installed() -> bool {
    venv().join("litestream").exists() && venv().join("moto_server").exists()
}

/// What agentfs needs to replicate to moto: credentials and the Litestream to run. A CA bundle
/// meant for real endpoints makes Litestream 0.5.17 refuse a plain-HTTP one, so a command
/// given this environment must also drop AWS_CA_BUNDLE ([`apply`]).
pub fn env() -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_DEFAULT_REGION", "us-east-1".into()),
        (
            "AGENTFS_LITESTREAM",
            venv().join("litestream").display().to_string(),
        ),
    ]
}

/// Give `cmd` the environment of [`env`].
pub fn apply(cmd: &mut Command) -> &mut Command {
    cmd.envs(env()).env_remove("AWS_CA_BUNDLE")
}

/// A moto S3 server on a free loopback port, ended by its pid on drop.
pub struct S3 {
    pub child: Child,
    pub port: u16,
}

impl S3 {
    pub fn start() -> S3 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(venv().join("moto_server"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server (run validation/install-deps.sh)");
        let s3 = S3 { child, port };
        let deadline = Instant::now() + LISTEN_WAIT;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        s3
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Make `bucket`; returns the replica URL of `path` in it (`{n}` and the like are kept).
    pub fn bucket(&self, bucket: &str, path: &str) -> String {
        let out = apply(Command::new(venv().join("python")).args([
            "-c",
            &format!(
                "import boto3; boto3.client('s3', endpoint_url='{}').create_bucket(Bucket='{bucket}')",
                self.endpoint()
            ),
        ]))
        .output()
        .expect("run python");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        format!(
            "s3://{bucket}/{path}?endpoint={}&forcePathStyle=true&region=us-east-1",
            self.endpoint()
        )
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
