//! A real `docker-registry` (distribution v2.8) on 127.0.0.1, one per test.

use std::fs;
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::image::{Image, Index, PushedImage, PushedIndex, Pusher};

/// Path of the registry binary: `$DOCKER_REGISTRY_BIN` or `/usr/bin/docker-registry`.
pub fn registry_bin() -> PathBuf {
    std::env::var_os("DOCKER_REGISTRY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/docker-registry"))
}

/// How to run the registry.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Require HTTP basic auth with these credentials (an htpasswd file made with `htpasswd -Bbn`).
    pub basic_auth: Option<(String, String)>,
    /// Serve HTTPS with a freshly generated self-signed certificate for 127.0.0.1.
    pub tls: bool,
    /// Serve HTTPS with a certificate from a fresh test CA, and require a client certificate
    /// from that CA (mutual TLS).
    pub client_certs: bool,
}

impl RegistryOptions {
    pub fn with_basic_auth(mut self, username: &str, password: &str) -> Self {
        self.basic_auth = Some((username.to_string(), password.to_string()));
        self
    }

    pub fn with_tls(mut self) -> Self {
        self.tls = true;
        self
    }

    pub fn with_client_certs(mut self) -> Self {
        self.tls = true;
        self.client_certs = true;
        self
    }
}

/// A test CA and what it signed: the registry's server certificate and a client certificate.
#[derive(Debug, Clone)]
pub struct TestPki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// A running registry; the process is killed when this is dropped.
pub struct Registry {
    child: Child,
    port: u16,
    opts: RegistryOptions,
    storage: PathBuf,
    log: PathBuf,
    cert: Option<PathBuf>,
    pki: Option<TestPki>,
    // Dropped last: holds config, storage, log and certificate.
    dir: tempfile::TempDir,
}

impl Registry {
    /// Start a registry on a free loopback port and wait until `/v2/` answers.
    pub async fn start(opts: RegistryOptions) -> Result<Registry> {
        let bin = registry_bin();
        ensure!(
            bin.exists(),
            "{} not found: install the `docker-registry` package (hack/install-deps.sh)",
            bin.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("crishim-registry-")
            .tempdir()?;
        let storage = dir.path().join("storage");
        fs::create_dir_all(&storage)?;

        let htpasswd = match &opts.basic_auth {
            Some((user, pass)) => Some(make_htpasswd(dir.path(), user, pass)?),
            None => None,
        };
        let pki = if opts.client_certs {
            Some(make_pki(dir.path())?)
        } else {
            None
        };
        let cert = match &pki {
            Some(p) => Some((p.server_cert.clone(), p.server_key.clone())),
            None if opts.tls => Some(make_self_signed_cert(dir.path())?),
            None => None,
        };

        // The port is picked by binding to :0 and released before the registry binds it; another
        // test may grab it in between, so retry a few times when the registry exits early.
        let client = http_client(pki.as_ref())?;
        let mut last_err = None;
        for _attempt in 0..5 {
            let port = free_port()?;
            let config = dir.path().join("config.yml");
            fs::write(
                &config,
                config_yaml(
                    port,
                    &storage,
                    htpasswd.as_deref(),
                    cert.as_ref(),
                    pki.as_ref().map(|p| p.ca.as_path()),
                ),
            )?;
            let log = dir.path().join(format!("registry-{port}.log"));
            let logf = fs::File::create(&log)?;
            let child = Command::new(&bin)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(logf.try_clone()?)
                .stderr(logf)
                .spawn()
                .with_context(|| format!("spawning {}", bin.display()))?;
            let mut child = child;
            let scheme = if opts.tls { "https" } else { "http" };
            let url = format!("{scheme}://127.0.0.1:{port}/v2/");
            match wait_ready(&mut child, &client, &url, Duration::from_secs(20)).await {
                Ok(()) => {
                    return Ok(Registry {
                        child,
                        port,
                        opts,
                        storage,
                        log,
                        cert: cert.map(|(c, _)| c),
                        pki,
                        dir,
                    })
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let text = fs::read_to_string(&log).unwrap_or_default();
                    last_err = Some(e.context(format!("registry log:\n{}", tail(&text, 4000))));
                }
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("registry did not start")))
    }

    /// `127.0.0.1:PORT`
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT` or `https://…` when TLS is on.
    pub fn url(&self) -> String {
        let scheme = if self.opts.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.host())
    }

    /// The credentials the registry requires, if any.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.opts
            .basic_auth
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// PEM certificate of the registry when TLS is on (the CA's, with client certificates).
    pub fn ca_cert(&self) -> Option<&Path> {
        match &self.pki {
            Some(p) => Some(&p.ca),
            None => self.cert.as_deref(),
        }
    }

    /// The test CA and its certificates, with [`RegistryOptions::with_client_certs`].
    pub fn pki(&self) -> Option<&TestPki> {
        self.pki.as_ref()
    }

    /// The registry's temporary directory (config, storage, log, certificate).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Root of the filesystem storage driver.
    pub fn storage_dir(&self) -> &Path {
        &self.storage
    }

    /// Everything the registry has logged so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// An HTTP client fit for this registry (accepts its self-signed certificate, no proxy).
    pub fn http_client(&self) -> Result<reqwest::Client> {
        http_client(self.pki.as_ref())
    }

    /// A pusher authenticated with the registry's credentials.
    pub fn pusher(&self) -> Result<Pusher> {
        Ok(Pusher::new(
            self.http_client()?,
            &self.url(),
            self.credentials()
                .map(|(u, p)| (u.to_string(), p.to_string())),
        ))
    }

    /// Push `image` as `repo:tag` (blobs, then the manifest).
    pub async fn push(&self, repo: &str, tag: &str, image: &Image) -> Result<PushedImage> {
        let mut pushed = self.pusher()?.push_image(repo, tag, image).await?;
        pushed.host = self.host();
        Ok(pushed)
    }

    /// Push every image of `index` by digest, then the index as `repo:tag`.
    pub async fn push_index(&self, repo: &str, tag: &str, index: &Index) -> Result<PushedIndex> {
        let mut pushed = self.pusher()?.push_index(repo, tag, index).await?;
        pushed.host = self.host();
        for m in &mut pushed.images {
            m.host = self.host();
        }
        Ok(pushed)
    }

    /// Path of a stored blob's data file (`sha256:<hex>` or bare hex).
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Overwrite a stored blob with different bytes of the same length: every byte from the
    /// middle on is inverted, so the registry keeps serving it with the original digest and
    /// length but its content no longer matches.
    pub fn corrupt_blob(&self, digest: &str) -> Result<()> {
        let path = self.blob_path(digest);
        let mut data = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        ensure!(!data.is_empty(), "blob {digest} is empty");
        let mid = data.len() / 2;
        for b in &mut data[mid..] {
            *b = !*b;
        }
        fs::write(&path, &data)?;
        Ok(())
    }

    /// Overwrite a stored blob with `bytes`, which must differ and have the same length.
    pub fn replace_blob(&self, digest: &str, bytes: &[u8]) -> Result<()> {
        let path = self.blob_path(digest);
        let old = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        ensure!(
            old.len() == bytes.len(),
            "replacement for {digest} has {} bytes, the blob has {}",
            bytes.len(),
            old.len()
        );
        ensure!(old != bytes, "replacement for {digest} is identical");
        let mut f = fs::File::create(&path)?;
        f.write_all(bytes)?;
        Ok(())
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() && std::env::var_os("CRISHIM_TEST_QUIET").is_none() {
            eprintln!(
                "---- docker-registry log ({}) ----\n{}",
                self.host(),
                tail(&self.log_text(), 6000)
            );
        }
    }
}

pub(crate) fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// A client that accepts the registry's certificate, and presents the test CA's client
/// certificate when there is one.
fn http_client(pki: Option<&TestPki>) -> Result<reqwest::Client> {
    let mut b = reqwest::Client::builder()
        .no_proxy()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(60));
    if let Some(p) = pki {
        let mut pem = fs::read(&p.client_cert)?;
        pem.extend(fs::read(&p.client_key)?);
        b = b.identity(reqwest::Identity::from_pem(&pem)?);
    }
    Ok(b.build()?)
}

async fn wait_ready(
    child: &mut Child,
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("docker-registry exited early with {status}");
        }
        if let Ok(resp) = client.get(url).send().await {
            let code = resp.status().as_u16();
            if code == 200 || code == 401 {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("docker-registry did not answer {url} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn config_yaml(
    port: u16,
    storage: &Path,
    htpasswd: Option<&Path>,
    tls: Option<&(PathBuf, PathBuf)>,
    client_ca: Option<&Path>,
) -> String {
    let mut y = format!(
        "version: 0.1\n\
         log:\n  level: info\n  accesslog:\n    disabled: false\n\
         storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  maintenance:\n    uploadpurging:\n      enabled: false\n\
         http:\n  addr: 127.0.0.1:{port}\n  secret: crishim-test-secret\n",
        storage.display()
    );
    if let Some((cert, key)) = tls {
        y.push_str(&format!(
            "  tls:\n    certificate: {}\n    key: {}\n",
            cert.display(),
            key.display()
        ));
        if let Some(ca) = client_ca {
            y.push_str(&format!("    clientcas:\n      - {}\n", ca.display()));
        }
    }
    if let Some(h) = htpasswd {
        y.push_str(&format!(
            "auth:\n  htpasswd:\n    realm: crishim-test\n    path: {}\n",
            h.display()
        ));
    }
    y
}

fn make_htpasswd(dir: &Path, user: &str, pass: &str) -> Result<PathBuf> {
    let out = Command::new("htpasswd")
        .args(["-Bbn", user, pass])
        .output()
        .context("running htpasswd (package apache2-utils)")?;
    ensure!(
        out.status.success(),
        "htpasswd failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("htpasswd");
    fs::write(&path, &out.stdout)?;
    Ok(path)
}

/// Run `openssl ARGS`, which must succeed.
fn openssl(args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .context("running openssl")?;
    ensure!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `openssl req`: a new P-256 key at `key`, and at `out` a self-signed certificate (a CA, as
/// openssl makes them) or, with `csr`, a certificate signing request, for `subject`.
fn new_key(csr: bool, key: &Path, out: &Path, subject: &str, extra: &[&str]) -> Result<()> {
    let (key, out) = (key.to_string_lossy(), out.to_string_lossy());
    let mut args = vec![
        "req",
        if csr { "-new" } else { "-x509" },
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-keyout",
        &key,
        "-out",
        &out,
        "-subj",
        subject,
    ];
    args.extend_from_slice(extra);
    openssl(&args)
}

/// A test CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it.
fn make_pki(dir: &Path) -> Result<TestPki> {
    let p = |n: &str| dir.join(n);
    let s = |n: &str| dir.join(n).to_string_lossy().into_owned();
    new_key(
        false,
        &p("ca.key"),
        &p("ca.pem"),
        "/CN=crishim test CA",
        &[],
    )?;
    for (name, subject, ext) in [
        (
            "server",
            "/CN=127.0.0.1",
            "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        ),
        (
            "client",
            "/CN=crishim test client",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        ),
    ] {
        new_key(
            true,
            &p(&format!("{name}.key")),
            &p(&format!("{name}.csr")),
            subject,
            &[],
        )?;
        fs::write(p(&format!("{name}.ext")), ext)?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            &s(&format!("{name}.csr")),
            "-CA",
            &s("ca.pem"),
            "-CAkey",
            &s("ca.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &s(&format!("{name}.ext")),
            "-out",
            &s(&format!("{name}.pem")),
        ])?;
    }
    Ok(TestPki {
        ca: p("ca.pem"),
        server_cert: p("server.pem"),
        server_key: p("server.key"),
        client_cert: p("client.pem"),
        client_key: p("client.key"),
    })
}

fn make_self_signed_cert(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    new_key(
        false,
        &key,
        &cert,
        "/CN=127.0.0.1",
        &["-addext", "subjectAltName=IP:127.0.0.1"],
    )?;
    Ok((cert, key))
}
