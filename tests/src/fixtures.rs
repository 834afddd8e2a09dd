//! Images and layers shared by the test files.

use crate::image::{busybox_layer, Compression, Image, Layer, LayerBuilder, RawTar};

/// Layer 2 of [`multi_layer_image`]: `/data/{a,b}`, `/data/dir/x` and `/data/owned` (1000:1000).
pub fn data_layer() -> LayerBuilder {
    LayerBuilder::new()
        .dir("data", 0o755)
        .file("data/a", "a\n", 0o644)
        .file("data/b", "b\n", 0o644)
        .dir("data/dir", 0o755)
        .file("data/dir/x", "x\n", 0o600)
        .file_owned("data/owned", "owned by app\n", 0o640, 1000, 1000)
}

/// Layer 3 of [`multi_layer_image`]: whiteout of `/data/b`, `/data/dir` made opaque, new
/// `/data/dir/y`.
pub fn whiteout_layer() -> LayerBuilder {
    LayerBuilder::new()
        .dir("data", 0o755)
        .whiteout("data/b")
        .dir("data/dir", 0o755)
        .opaque("data/dir")
        .file("data/dir/y", "y\n", 0o644)
}

/// busybox (gzip) + [`data_layer`] (uncompressed) + [`whiteout_layer`] (zstd); user `app`.
pub fn multi_layer_image() -> Image {
    Image::new(vec![
        busybox_layer(),
        data_layer().build(Compression::None),
        whiteout_layer().build(Compression::Zstd),
    ])
    .user("app")
    .cmd(&["/bin/cat", "/data/a"])
}

/// A tiny one-layer image with `/marker` = `marker`.
pub fn small_image(marker: &str, c: Compression) -> Image {
    let l = LayerBuilder::new()
        .file("marker", format!("{marker}\n"), 0o644)
        .dir("etc", 0o755)
        .file("etc/marker", format!("{marker}\n"), 0o644)
        .build(c);
    Image::new(vec![l])
        .label("marker", marker)
        .cmd(&["/marker"])
}

/// An uncompressed layer with a file entry `../../escape-<token>` (after a harmless file).
pub fn dotdot_layer(token: &str) -> Layer {
    let mut t = RawTar::new();
    t.file("ok", b"ok\n", 0o644)
        .file(&format!("../../escape-{token}"), b"escaped\n", 0o644);
    Layer::from_tar(&t.finish(), Compression::None)
}

/// An uncompressed layer with a file entry `../` × 12 + `tmp/escape-<token>` (deep enough to
/// reach `/` from any store directory).
pub fn deep_dotdot_layer(token: &str) -> Layer {
    let mut t = RawTar::new();
    t.file(
        &format!("{}tmp/escape-{token}", "../".repeat(12)),
        b"escaped\n",
        0o644,
    );
    Layer::from_tar(&t.finish(), Compression::None)
}

/// An uncompressed layer: symlink `evil -> <target_dir>` (absolute), then file `evil/pwned`.
pub fn symlink_escape_layer(target_dir: &str) -> Layer {
    let mut t = RawTar::new();
    t.symlink("evil", target_dir)
        .file("evil/pwned", b"pwned\n", 0o644);
    Layer::from_tar(&t.finish(), Compression::None)
}

/// An uncompressed layer with a hardlink `name -> target` (e.g. `/etc/passwd`). Nothing is
/// written through the link: a broken unpacker must not be able to damage the host file.
pub fn hardlink_escape_layer(name: &str, target: &str) -> Layer {
    let mut t = RawTar::new();
    t.file("ok", b"ok\n", 0o644).hardlink(name, target);
    Layer::from_tar(&t.finish(), Compression::None)
}

/// A tar cut short in the middle of a 64 KiB file's data (no end-of-archive blocks), and the
/// offset where it was cut. Compressed with `c`; digest and diff_id match the cut bytes.
pub fn truncated_layer(c: Compression) -> Layer {
    let mut t = RawTar::new();
    t.dir("data/", 0o755).file("data/small", b"small\n", 0o644);
    let at = t.len();
    let big: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    t.file("data/big", &big, 0o644)
        .file("data/after", b"after\n", 0o644);
    let full = t.finish();
    let cut = at + 512 + 30_000;
    Layer::from_tar(&full[..cut], c)
}

/// A GNU long-name header (`L`) carrying a name of `len` bytes, then the entry it names.
/// Gzip'd, so a 64 MiB name is a blob of a few hundred KiB.
pub fn long_name_layer(len: usize) -> Layer {
    let mut t = RawTar::new();
    t.entry(
        tar::EntryType::GNULongName,
        "././@LongLink",
        "",
        0o644,
        &vec![b'n'; len],
    )
    .file("named-by-the-long-name", b"x\n", 0o644);
    Layer::from_tar(&t.finish(), Compression::Gzip)
}

/// One PAX record, `"<len> key=value\n"`, its length counting itself.
pub fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while len.to_string().len() + body.len() != len {
        len += 1;
    }
    format!("{len}{body}").into_bytes()
}

/// A PAX header of `kind` (`x` local or `g` global) with `records`, then a small file. Gzip'd.
pub fn pax_layer(kind: tar::EntryType, records: &[u8]) -> Layer {
    let mut t = RawTar::new();
    t.entry(kind, "PaxHeaders/f", "", 0o644, records)
        .file("f", b"x\n", 0o644);
    Layer::from_tar(&t.finish(), Compression::Gzip)
}

/// One file of `len` zero bytes. Gzip'd: a few KiB per MiB.
pub fn zeros_layer(len: usize) -> Layer {
    let mut t = RawTar::new();
    t.file("zeros", &vec![0u8; len], 0o644);
    Layer::from_tar(&t.finish(), Compression::Gzip)
}

/// `n` empty files in one directory. Gzip'd.
pub fn empty_files_layer(n: usize) -> Layer {
    let mut t = RawTar::new();
    t.dir("many/", 0o755);
    for i in 0..n {
        t.file(&format!("many/{i}"), b"", 0o644);
    }
    Layer::from_tar(&t.finish(), Compression::Gzip)
}
