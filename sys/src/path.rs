//! Paths as strings, cleaned without touching the file system (as Go's `filepath.Clean` of an
//! absolute path).

/// `path` made absolute and cleaned lexically: `//`, `.` and `..` resolved (`..` at the root
/// stays at the root).
pub fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn path_cleaning_matches_go() {
        assert_eq!(clean("/a//b/./c/.."), "/a/b");
        assert_eq!(clean("/../x/"), "/x");
        assert_eq!(clean("/"), "/");
        assert_eq!(clean(""), "/");
        assert_eq!(clean("a/b"), "/a/b");
    }
}
