//! A real `sshd` on a loopback port with throwaway keys, for the tests that reach another
//! node's daemon over SSH (tests/cluster/ssh_bridge.rs, tests/distributed/remote.rs). Needs
//! Debian's openssh-server (which .ci/run installs); without it `sshd()` says why and the test
//! passes, unless GPUPILOT_REQUIRE_PEERS=1.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::home::Home;
use super::net::free_port;
use super::peers::missing;
use super::wait::poll;

const BIN: &str = env!("CARGO_BIN_EXE_gpupilot");

pub fn sshd() -> Option<PathBuf> {
    let p = PathBuf::from("/usr/sbin/sshd");
    if p.exists() {
        return Some(p);
    }
    missing("/usr/sbin/sshd is not installed (Debian's openssh-server)");
    None
}

/// An sshd on 127.0.0.1 that lets this user in with a key made for the test.
pub struct Sshd {
    child: Child,
    pub port: u16,
    pub key: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path) {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

impl Sshd {
    pub fn start(sshd: &Path) -> Sshd {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        keygen(&d.join("host"));
        keygen(&d.join("user"));
        std::fs::copy(d.join("user.pub"), d.join("authorized_keys")).unwrap();
        let port = free_port();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host\nAuthorizedKeysFile {d}/authorized_keys\n\
             PidFile {d}/sshd.pid\nStrictModes no\nUsePAM no\nPermitRootLogin yes\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nLogLevel ERROR\n",
            d = d.display()
        );
        std::fs::write(d.join("sshd_config"), config).unwrap();
        // sshd refuses to start without its privilege-separation directory.
        let _ = std::fs::create_dir_all("/run/sshd");
        let child = Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        poll(
            &format!("sshd to listen on {port}"),
            Duration::from_secs(10),
            Duration::from_millis(20),
            || {
                std::net::TcpStream::connect(("127.0.0.1", port))
                    .map(drop)
                    .map_err(|e| format!(": {e}"))
            },
        );
        Sshd {
            child,
            port,
            key: d.join("user"),
            _dir: dir,
        }
    }

    /// `GPUPILOT_SSH`: ssh with this server's port and key, no host-key questions.
    pub fn ssh(&self) -> String {
        format!(
            "ssh -F /dev/null -p {} -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
            self.port,
            self.key.display()
        )
    }

    /// `GPUPILOT_SSH` for a daemon: ssh to this server whatever the node's name (`HostName`),
    /// as this user, with the test's key and no host-key questions.
    pub fn ssh_to_any_node(&self, port: u16) -> String {
        format!(
            "ssh -F /dev/null -p {port} -i {} -l {} -o HostName=127.0.0.1 -o StrictHostKeyChecking=no \
             -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
            self.key.display(),
            user()
        )
    }
}

/// The remote command: the test's binary, in the test daemon's home.
pub fn remote_command(home: &Home) -> String {
    format!(
        "env GPUPILOT_HOME={} {BIN} --source sim --gpus 2 bridge",
        home.root().display()
    )
}

pub fn user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}
