use super::*;

fn d(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn parse(json: &str, format: Format) -> Result<Toc, TocError> {
    Toc::parse(json.as_bytes(), format, 10_000, &Limits::default())
}

fn why(json: &str, format: Format) -> String {
    match parse(json, format) {
        Err(e) => e.to_string(),
        Ok(t) => panic!("accepted: {t:?}"),
    }
}

#[test]
fn an_estargz_toc_becomes_the_layers_entries() {
    let json = format!(
        r#"{{"version":1,"entries":[
        {{"name":"./","type":"dir","mode":493}},
        {{"name":"bin/","type":"dir","mode":493,"uid":0,"gid":0,"modtime":"2024-01-02T03:04:05Z"}},
        {{"name":"bin/big","type":"reg","size":300,"mode":33261,"offset":10,"chunkSize":100,"chunkDigest":"{a}","digest":"{f}",
          "xattrs":{{"user.a":"eA==","trusted.overlay.redirect":"Lw=="}}}},
        {{"name":"bin/big","type":"chunk","offset":60,"chunkOffset":100,"chunkSize":150,"chunkDigest":"{b}"}},
        {{"name":"bin/big","type":"chunk","offset":60,"chunkOffset":250,"innerOffset":150,"chunkDigest":"{c}"}},
        {{"name":".prefetch.landmark","type":"reg","size":1,"offset":200,"chunkDigest":"{a}"}},
        {{"name":"bin/sh","type":"symlink","linkName":"/bin/big"}},
        {{"name":"bin/also","type":"hardlink","linkName":"./bin/big"}},
        {{"name":"dev/null","type":"char","devMajor":1,"devMinor":3,"mode":438}},
        {{"name":"run/p","type":"fifo"}}
        ]}}"#,
        a = d('a'),
        b = d('b'),
        c = d('c'),
        f = d('f')
    );
    let t = parse(&json, Format::Estargz).unwrap();
    let paths: Vec<&str> = t.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "",
            "bin",
            "bin/big",
            ".prefetch.landmark",
            "bin/sh",
            "bin/also",
            "dev/null",
            "run/p"
        ]
    );
    assert_eq!(t.entries[1].mtime, Some(1_704_164_645));
    let big = &t.entries[2];
    assert_eq!(big.mode, 0o755);
    assert_eq!(big.xattrs, vec![("user.a".to_string(), b"x".to_vec())]);
    assert_eq!(
        t.dropped_xattrs, 1,
        "trusted.overlay.* is never a layer's to set"
    );
    let Kind::File {
        size,
        chunks,
        digest,
    } = &big.kind
    else {
        panic!("{big:?}")
    };
    assert_eq!((*size, digest.clone()), (300, Some(d('f'))));
    let got: Vec<(u64, u64, std::ops::Range<u64>, u64)> = chunks
        .iter()
        .map(|c| (c.file_offset, c.size, c.compressed.clone(), c.inner_offset))
        .collect();
    // Each member ends where the next starts; the two sharing one member end where it does,
    // the last one's at the TOC.
    assert_eq!(
        got,
        [
            (0, 100, 10..60, 0),
            (100, 150, 60..200, 0),
            (250, 50, 60..200, 150)
        ]
    );
    assert_eq!(t.prefetch_before, Some(3));
    let Kind::File { chunks, .. } = &t.entries[3].kind else {
        panic!()
    };
    assert_eq!(
        chunks[0].compressed,
        200..10_000,
        "the last member ends at the TOC"
    );
    assert_eq!(
        t.entries[4].kind,
        Kind::Symlink {
            target: "/bin/big".into()
        },
        "a symlink's target is the container's to resolve, not the host's"
    );
    assert_eq!(
        t.entries[5].kind,
        Kind::Hardlink {
            target: "bin/big".into()
        }
    );
    assert_eq!(t.entries[6].kind, Kind::Char { major: 1, minor: 3 });
}

#[test]
fn a_zstd_chunked_toc_has_end_offsets_holes_and_whole_file_digests() {
    let json = format!(
        r#"{{"version":1,"entries":[
        {{"type":"reg","name":"a","size":20,"offset":8,"endOffset":30,"digest":"{f}"}},
        {{"type":"reg","name":"sparse","size":300,"offset":30,"endOffset":50,"chunkSize":100,"chunkDigest":"{a}"}},
        {{"type":"chunk","name":"sparse","chunkOffset":100,"chunkSize":100,"chunkType":"zeros"}},
        {{"type":"chunk","name":"sparse","offset":50,"endOffset":70,"chunkOffset":200,"chunkSize":100,"chunkDigest":"{b}"}}
        ]}}"#,
        f = d('f'),
        a = d('a'),
        b = d('b')
    );
    let t = parse(&json, Format::ZstdChunked).unwrap();
    let Kind::File { chunks, .. } = &t.entries[0].kind else {
        panic!()
    };
    assert_eq!(
        chunks[0].digest,
        Some(d('f')),
        "a whole file goes by its digest"
    );
    assert_eq!(chunks[0].compressed, 8..30);
    let Kind::File { chunks, .. } = &t.entries[1].kind else {
        panic!()
    };
    assert!(chunks[1].zeros && chunks[1].digest.is_none());
    assert_eq!(chunks[2].compressed, 50..70);
    assert_eq!(t.prefetch_before, None);
}

#[test]
fn hostile_tocs_are_refused_naming_the_entry() {
    let a = d('a');
    // A regular file of `size` bytes at `offset`, with `extra` fields.
    let file = |size: i64, offset: i64, extra: &str| {
        format!(
            r#"{{"version":1,"entries":[{{"name":"f","type":"reg","size":{size},"offset":{offset},"chunkDigest":"{a}"{extra}}}]}}"#
        )
    };
    let reg = |extra: &str| file(10, 5, extra);
    for (json, format, needle) in [
        (
            r#"{"version":2,"entries":[]}"#.to_string(),
            Format::Estargz,
            "version 2",
        ),
        ("{".into(), Format::Estargz, "not valid JSON"),
        (
            r#"{"version":1,"entries":[{"name":"../etc/passwd","type":"reg"}]}"#.into(),
            Format::Estargz,
            "escapes the layer",
        ),
        (
            r#"{"version":1,"entries":[{"name":"a/../../b","type":"dir"}]}"#.into(),
            Format::Estargz,
            "escapes the layer",
        ),
        (
            r#"{"version":1,"entries":[{"name":"a\u0000b","type":"dir"}]}"#.into(),
            Format::Estargz,
            "NUL",
        ),
        (
            r#"{"version":1,"entries":[{"name":"a","type":"socket"}]}"#.into(),
            Format::Estargz,
            "unknown entry type",
        ),
        (
            r#"{"version":1,"entries":[{"name":"a","type":"chunk","chunkOffset":5}]}"#.into(),
            Format::Estargz,
            "follows no regular file",
        ),
        (
            r#"{"version":1,"entries":[{"name":"h","type":"hardlink","linkName":"nothing"}]}"#
                .into(),
            Format::Estargz,
            "no earlier regular file",
        ),
        (
            r#"{"version":1,"entries":[{"name":"h","type":"hardlink","linkName":"../x"}]}"#.into(),
            Format::Estargz,
            "escapes the layer",
        ),
        (reg(r#","uid":-1"#), Format::Estargz, "uid -1"),
        (file(10, 10_000, ""), Format::Estargz, "outside the blob"),
        (file(10, -3, ""), Format::Estargz, "negative"),
        (
            reg(r#","chunkSize":20"#),
            Format::Estargz,
            "a chunk of 20 bytes",
        ),
        (reg(r#","chunkOffset":3"#), Format::Estargz, "chunkOffset 3"),
        (file(-1, 5, ""), Format::Estargz, "negative"),
        (
            reg(r#","chunkType":"weird""#),
            Format::Estargz,
            "unknown chunkType",
        ),
        (
            reg(r#","endOffset":5"#),
            Format::ZstdChunked,
            "not past offset",
        ),
        (
            reg(r#","endOffset":20000"#),
            Format::ZstdChunked,
            "outside the blob",
        ),
        (
            reg(r#","xattrs":{"user.x":"!!"}"#),
            Format::Estargz,
            "not base64",
        ),
        (reg(r#","digest":"md5:00""#), Format::Estargz, "not sha256"),
        (
            r#"{"version":1,"entries":[{"name":"f","type":"reg","size":10,"offset":5}]}"#.into(),
            Format::Estargz,
            "could not be checked",
        ),
    ] {
        let got = why(&json, format);
        assert!(got.contains(needle), "{json}: {got}");
    }
    // A chunk that overlaps the one before it.
    let json = format!(
        r#"{{"version":1,"entries":[
        {{"name":"f","type":"reg","size":10,"offset":5,"chunkSize":5,"chunkDigest":"{a}"}},
        {{"name":"f","type":"chunk","offset":6,"chunkOffset":4,"chunkSize":6,"chunkDigest":"{a}"}}]}}"#
    );
    assert!(
        why(&json, Format::Estargz).contains("entry 1"),
        "named by index"
    );
}

#[test]
fn every_bound_holds_at_its_limit_and_fails_one_past_it() {
    let limits = Limits {
        toc_bytes: 4096,
        entries: 3,
        name_bytes: 10,
        xattr_bytes: 20,
        chunk_bytes: 100,
    };
    let parse = |json: &str| Toc::parse(json.as_bytes(), Format::Estargz, 1000, &limits);
    let dirs = |n: usize| {
        let e: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"name":"d{i}","type":"dir"}}"#))
            .collect();
        format!(r#"{{"version":1,"entries":[{}]}}"#, e.join(","))
    };
    assert!(parse(&dirs(3)).is_ok());
    assert_eq!(parse(&dirs(4)), Err(TocError::TooManyEntries { limit: 3 }));
    let big = format!("{}{}", dirs(1), " ".repeat(4096));
    assert!(matches!(parse(&big), Err(TocError::TooBig { .. })));
    let name = |n: usize| {
        format!(
            r#"{{"version":1,"entries":[{{"name":"{}","type":"dir"}}]}}"#,
            "a".repeat(n)
        )
    };
    assert!(parse(&name(10)).is_ok());
    assert!(parse(&name(11))
        .unwrap_err()
        .to_string()
        .contains("over the 10-byte limit"));
    let x = |v: &str| {
        format!(
            r#"{{"version":1,"entries":[{{"name":"a","type":"dir","xattrs":{{"user.k":"{v}"}}}}]}}"#
        )
    };
    assert!(parse(&x("eHh4eHh4eHh4eHh4eHg=")).is_ok(), "6 + 14 bytes");
    assert!(parse(&x("eHh4eHh4eHh4eHh4eHh4")).is_err(), "6 + 15 bytes");
    assert!(
        parse(&x(&"A".repeat(4000))).is_err(),
        "refused before it is decoded"
    );
    let a = d('a');
    let chunk = |n: u64| {
        format!(
            r#"{{"version":1,"entries":[{{"name":"f","type":"reg","size":{n},"offset":1,"chunkDigest":"{a}"}}]}}"#
        )
    };
    assert!(parse(&chunk(100)).is_ok());
    assert!(parse(&chunk(101))
        .unwrap_err()
        .to_string()
        .contains("over the 100-byte limit"));
}

#[test]
fn flipped_bytes_never_panic() {
    let a = d('a');
    let json = format!(
        r#"{{"version":1,"entries":[{{"name":"f","type":"reg","size":300,"offset":10,"chunkSize":100,"chunkDigest":"{a}"}},{{"name":"f","type":"chunk","offset":60,"chunkOffset":100,"chunkDigest":"{a}"}}]}}"#
    );
    let bytes = json.into_bytes();
    for i in 0..bytes.len() {
        for bit in [1u8, 0x10, 0x80] {
            let mut b = bytes.clone();
            b[i] ^= bit;
            let _ = Toc::parse(&b, Format::Estargz, 1000, &Limits::default());
            let _ = Toc::parse(&b, Format::ZstdChunked, 1000, &Limits::default());
        }
    }
}
