//! `.dockerignore` semantics, as the E2B Python SDK applies them to a COPY source (its port of
//! moby/patternmatcher).
//!
//! The SDK's filesHash covers exactly the files its matcher keeps, so a matcher that disagrees
//! on a single path makes every COPY a cache miss against the SDK, or worse, uploads a file the
//! user meant to keep out. Hence the port is faithful down to moby's quirks:
//! * the last matching pattern wins and `!` re-includes;
//! * patterns are tried on every parent first, and one that matched a parent also matches
//!   everything under it, which is how `build` excludes `build/x/y`;
//! * a pattern without wildcards is a string comparison, one ending in `**` a prefix test and
//!   one starting with `**` a suffix test (so `**foo` also matches `barfoo`), everything else
//!   a regex in which `**` does not cross a newline;
//! * patterns are cleaned like paths (`./a`, `a/../b`, `//`), and a leading `/` is dropped.

use super::path_glob::{normpath, parse_docker_class, GlobSyntaxError, Token};

/// A pattern the SDK (and Docker) would refuse, failing the build.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IgnorePatternError {
    #[error(
        "invalid ignore pattern '{pattern}': {reason}; fix or remove it (in .dockerignore or \
         the ignore patterns passed in)"
    )]
    Invalid { pattern: String, reason: String },
}

#[derive(Debug, Clone)]
enum Test {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Tokens(Vec<Token>),
}

#[derive(Debug, Clone)]
struct Pattern {
    /// A `!` pattern.
    negation: bool,
    cleaned: String,
    /// `cleaned` split on `/`, for [`IgnoreMatcher::may_match_under`].
    dirs: Vec<String>,
    test: Test,
}

impl Pattern {
    fn matches(&self, path: &str) -> bool {
        match &self.test {
            Test::Exact(s) => path == s,
            Test::Prefix(s) => path.starts_with(s.as_str()),
            Test::Suffix(s) => {
                path.ends_with(s.as_str()) || (s.starts_with('/') && path == &s[1..])
            }
            Test::Tokens(tokens) => {
                let chars: Vec<char> = path.chars().collect();
                super::path_glob::match_tokens(tokens, &chars)
            }
        }
    }
}

/// Compiled `.dockerignore` patterns, matched against `/`-separated paths relative to the
/// context root. The default matcher excludes nothing.
#[derive(Debug, Clone, Default)]
pub struct IgnoreMatcher {
    patterns: Vec<Pattern>,
}

impl IgnoreMatcher {
    /// Compiles patterns as the SDK's `PatternMatcher` does: lines starting with `#` and blank
    /// ones are skipped, the rest trimmed and cleaned.
    pub fn new(patterns: &[String]) -> Result<Self, IgnorePatternError> {
        let mut compiled = Vec::new();
        for original in patterns {
            if original.starts_with('#') {
                continue;
            }
            let mut pattern = py_strip(original);
            if pattern.is_empty() {
                continue;
            }
            let negation = pattern.starts_with('!');
            if negation {
                pattern = py_strip(&pattern[1..]);
                if pattern.is_empty() {
                    return Err(IgnorePatternError::Invalid {
                        pattern: original.clone(),
                        reason: "illegal exclusion pattern".into(),
                    });
                }
            }
            let mut cleaned = clean(pattern);
            if cleaned.len() > 1 && cleaned.starts_with('/') {
                cleaned.remove(0);
            }
            let test = compile(&cleaned).map_err(|e| IgnorePatternError::Invalid {
                pattern: original.clone(),
                reason: e.to_string(),
            })?;
            compiled.push(Pattern {
                negation,
                dirs: cleaned.split('/').map(str::to_owned).collect(),
                cleaned,
                test,
            });
        }
        Ok(Self { patterns: compiled })
    }

    /// [`Self::new`] after [`anchor_to_context`] on each pattern: what the SDK builds for a
    /// COPY from `.dockerignore` plus the template's ignore patterns.
    pub fn for_context(patterns: &[String], context: &str) -> Result<Self, IgnorePatternError> {
        let anchored: Vec<String> = patterns
            .iter()
            .map(|p| anchor_to_context(p, context))
            .collect();
        Self::new(&anchored)
    }

    /// The cleaned patterns, `!`-prefixed for re-inclusions, comments and blanks dropped.
    pub fn patterns(&self) -> Vec<String> {
        self.patterns
            .iter()
            .map(|p| format!("{}{}", if p.negation { "!" } else { "" }, p.cleaned))
            .collect()
    }

    /// Whether `relative_path` (relative to the context root, `/`-separated) is excluded.
    pub fn matches(&self, relative_path: &str) -> bool {
        let mut ends: Vec<usize> = relative_path.match_indices('/').map(|(i, _)| i).collect();
        ends.push(relative_path.len());
        let mut parent_matched: Vec<bool> = Vec::new();
        let mut matched = false;
        for end in ends {
            let current = &relative_path[..end];
            let mut current_matched = Vec::with_capacity(self.patterns.len());
            matched = false;
            for (i, pattern) in self.patterns.iter().enumerate() {
                let mut hit = parent_matched.get(i).copied().unwrap_or(false);
                if !hit {
                    // A re-inclusion cannot change a path nothing excluded yet, and an
                    // exclusion cannot change one already excluded: skip the test.
                    if pattern.negation != matched {
                        current_matched.push(false);
                        continue;
                    }
                    hit = pattern.matches(current);
                }
                current_matched.push(hit);
                if hit {
                    matched = !pattern.negation;
                }
            }
            parent_matched = current_matched;
        }
        matched
    }

    /// Whether a `!` pattern could re-include something under `dir`: an excluded directory
    /// must then still be walked. Conservative, as moby is: a wildcard segment is assumed to
    /// match.
    pub fn may_match_under(&self, dir: &str) -> bool {
        let dir_segments: Vec<&str> = dir.split('/').collect();
        self.patterns
            .iter()
            .filter(|p| p.negation)
            .any(|p| pattern_may_match_under(p, &dir_segments))
    }
}

fn pattern_may_match_under(pattern: &Pattern, dir_segments: &[&str]) -> bool {
    for (i, dir_segment) in dir_segments.iter().enumerate() {
        let Some(segment) = pattern.dirs.get(i) else {
            return false;
        };
        if segment.contains("**") {
            return true;
        }
        if !segment.contains(['*', '?', '[', '\\']) && segment != dir_segment {
            return false;
        }
    }
    pattern.dirs.len() > dir_segments.len()
}

/// Collapses repeated `/`, then cleans like Go's `filepath.Clean`.
fn clean(pattern: &str) -> String {
    let mut collapsed = String::with_capacity(pattern.len());
    for c in pattern.chars() {
        if !(c == '/' && collapsed.ends_with('/')) {
            collapsed.push(c);
        }
    }
    normpath(&collapsed)
}

/// Compiles a cleaned pattern, choosing moby's fast path where it would: the choice changes
/// results (a suffix test is not anchored at a segment start).
fn compile(pattern: &str) -> Result<Test, GlobSyntaxError> {
    #[derive(PartialEq)]
    enum Kind {
        Exact,
        Prefix,
        Suffix,
        Tokens,
    }
    let chars: Vec<char> = pattern.chars().collect();
    let n = chars.len();
    let mut tokens = Vec::new();
    let mut kind = Kind::Exact;
    let mut i = 0;
    while i < n {
        let first = i == 0;
        let c = chars[i];
        i += 1;
        match c {
            '*' if chars.get(i) == Some(&'*') => {
                i += 1;
                // `**/` counts as `**`.
                if chars.get(i) == Some(&'/') {
                    i += 1;
                }
                if i >= n {
                    tokens.push(Token::AnyRun);
                    kind = if kind == Kind::Exact {
                        Kind::Prefix
                    } else {
                        Kind::Tokens
                    };
                } else {
                    tokens.push(Token::DirPrefix);
                    kind = Kind::Tokens;
                }
                if first {
                    kind = Kind::Suffix;
                }
            }
            '*' => {
                tokens.push(Token::Star);
                kind = Kind::Tokens;
            }
            '?' => {
                tokens.push(Token::AnyChar);
                kind = Kind::Tokens;
            }
            '[' => {
                let (class, next) = parse_docker_class(&chars, i - 1)?;
                tokens.push(Token::Class(class));
                i = next;
                kind = Kind::Tokens;
            }
            ']' => {
                tokens.push(Token::Literal(']'));
                kind = Kind::Tokens;
            }
            '\\' => {
                let escaped = *chars.get(i).ok_or(GlobSyntaxError::Syntax)?;
                tokens.push(Token::Literal(escaped));
                i += 1;
                kind = Kind::Tokens;
            }
            other => tokens.push(Token::Literal(other)),
        }
    }
    // Python's `re` refuses a reversed range, but only once the whole pattern passed Go's
    // syntax check: report syntax errors first, as the SDK does.
    for token in &tokens {
        if let Token::Class(class) = token {
            if let Some((lo, hi)) = class.reversed_range() {
                return Err(GlobSyntaxError::ReversedRange(lo, hi));
            }
        }
    }
    Ok(match kind {
        Kind::Exact => Test::Exact(pattern.to_owned()),
        Kind::Prefix => Test::Prefix(pattern[..pattern.len() - 2].to_owned()),
        Kind::Suffix => Test::Suffix(pattern[2..].to_owned()),
        Kind::Tokens => Test::Tokens(tokens),
    })
}

/// The SDK's rewrite of an absolute pattern that points inside the context (`/ctx/build`
/// becomes `build`); every other pattern stays as written (a leading `/` is later dropped, so
/// `/build` means `build` at the context root). `context` must be absolute and clean.
pub fn anchor_to_context(pattern: &str, context: &str) -> String {
    let pattern = py_strip(pattern);
    let negated = pattern.starts_with('!');
    let mut body = if negated {
        py_strip(&pattern[1..])
    } else {
        pattern
    };
    let relative;
    if body.starts_with('/') {
        relative = relpath(body, context);
        if relative != "." && relative != ".." && !relative.starts_with("../") {
            body = &relative;
        }
    }
    format!("{}{body}", if negated { "!" } else { "" })
}

/// Python's `os.path.relpath` for two absolute paths.
fn relpath(path: &str, start: &str) -> String {
    let path = normpath(path);
    let start = normpath(start);
    let path_parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let start_parts: Vec<&str> = start.split('/').filter(|s| !s.is_empty()).collect();
    let common = path_parts
        .iter()
        .zip(&start_parts)
        .take_while(|(a, b)| a == b)
        .count();
    let mut out: Vec<&str> = vec![".."; start_parts.len() - common];
    out.extend(&path_parts[common..]);
    if out.is_empty() {
        ".".into()
    } else {
        out.join("/")
    }
}

/// The SDK's `read_dockerignore` on the file's text: a UTF-8 BOM dropped, `\r\n` and `\r`
/// read as line ends (Python's universal newlines), lines starting with `#` and blank lines
/// skipped, the rest trimmed.
pub fn parse_dockerignore(content: &str) -> Vec<String> {
    let content = content.strip_prefix('\u{feff}').unwrap_or(content);
    let content = content.replace("\r\n", "\n").replace('\r', "\n");
    content
        .split('\n')
        .filter(|line| !line.starts_with('#'))
        .map(py_strip)
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Python's `str.strip()`: its whitespace also includes the separators U+001C..U+001F,
/// which Rust's `trim` keeps.
fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(patterns: &[&str]) -> IgnoreMatcher {
        let patterns: Vec<String> = patterns.iter().map(|p| p.to_string()).collect();
        IgnoreMatcher::new(&patterns).unwrap()
    }

    fn error(pattern: &str) -> String {
        IgnoreMatcher::new(&[pattern.to_string()])
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn markdown_files_except_the_readme() {
        let m = matcher(&["*.md", "!README.md"]);
        assert!(m.matches("notes.md"));
        assert!(!m.matches("README.md"));
        assert!(
            !m.matches("docs/notes.md"),
            "`*` stays in the first segment"
        );
        assert!(!m.matches("main.go"));
    }

    #[test]
    fn docker_docs_readme_secret_example() {
        let m = matcher(&["*.md", "!README*.md", "README-secret.md"]);
        assert!(m.matches("README-secret.md"));
        assert!(!m.matches("README-public.md"));
        assert!(m.matches("CHANGELOG.md"));
    }

    #[test]
    fn double_star_matches_any_number_of_directories() {
        let m = matcher(&["**/*.go"]);
        assert!(m.matches("main.go"));
        assert!(m.matches("cmd/tool/main.go"));
        assert!(!m.matches("main.rs"));
        let m = matcher(&["a/**/b"]);
        assert!(m.matches("a/b"));
        assert!(m.matches("a/x/y/b"));
        assert!(!m.matches("a/xb"));
    }

    #[test]
    fn question_mark_is_exactly_one_character() {
        let m = matcher(&["temp?"]);
        assert!(m.matches("tempa"));
        assert!(m.matches("tempb"));
        assert!(!m.matches("temp"));
        assert!(!m.matches("tempab"));
        let m = matcher(&["*/temp*"]);
        assert!(m.matches("somedir/temporary.txt"));
        assert!(m.matches("somedir/temp"));
        assert!(!m.matches("temp"));
        let m = matcher(&["*/*/temp*"]);
        assert!(m.matches("somedir/subdir/temporary.txt"));
        assert!(!m.matches("somedir/temporary.txt"));
    }

    #[test]
    fn a_directory_pattern_excludes_everything_under_it() {
        let m = matcher(&["build"]);
        assert!(m.matches("build"));
        assert!(m.matches("build/out/app.bin"));
        assert!(!m.matches("builder"));
        assert!(
            !m.matches("src/build"),
            "an unanchored name is still rooted at the context"
        );
        assert!(!m.may_match_under("build"));
    }

    #[test]
    fn a_negation_re_includes_a_file_under_an_excluded_directory() {
        let m = matcher(&["docs", "!docs/keep.md"]);
        assert!(m.matches("docs"));
        assert!(m.matches("docs/other.md"));
        assert!(!m.matches("docs/keep.md"));
        assert!(m.may_match_under("docs"));
        assert!(!m.may_match_under("src"));
        let m = matcher(&["docs", "!docs/*/keep.md"]);
        assert!(m.may_match_under("docs"));
        assert!(m.may_match_under("docs/any"));
        assert!(!m.may_match_under("docs/any/deeper"));
        assert!(matcher(&["x", "!**/keep"]).may_match_under("x/y/z"));
    }

    #[test]
    fn a_negated_parent_re_includes_its_children() {
        let m = matcher(&["*", "!app"]);
        assert!(m.matches("README"));
        assert!(!m.matches("app"));
        assert!(!m.matches("app/src/main.rs"));
    }

    #[test]
    fn the_last_matching_pattern_wins() {
        let m = matcher(&["*.log", "!keep.log", "keep.log"]);
        assert!(m.matches("keep.log"));
        let m = matcher(&["keep.log", "*.log", "!keep.log"]);
        assert!(!m.matches("keep.log"));
        assert!(m.matches("other.log"));
    }

    #[test]
    fn a_leading_slash_and_dot_segments_are_cleaned() {
        for pattern in ["/foo", "./foo", "foo/", "bar/../foo", "//foo", "foo/./"] {
            let m = matcher(&[pattern]);
            assert!(m.matches("foo"), "{pattern}");
            assert!(m.matches("foo/x"), "{pattern}");
            assert!(!m.matches("bar/foo"), "{pattern}");
        }
        assert_eq!(
            matcher(&["/../a", "!./b/../c/"]).patterns(),
            vec!["a".to_string(), "!c".to_string()]
        );
        assert_eq!(matcher(&["../x"]).patterns(), vec!["../x".to_string()]);
    }

    #[test]
    fn moby_fast_paths_are_kept() {
        // A leading `**` is a suffix test: not anchored at a segment start.
        let m = matcher(&["**foo"]);
        assert!(m.matches("barfoo"));
        assert!(m.matches("a/barfoo"));
        let m = matcher(&["**/foo"]);
        assert!(m.matches("foo"));
        assert!(m.matches("a/foo"));
        assert!(!m.matches("afoo"));
        // A trailing `**` is a prefix test.
        let m = matcher(&["a.b**"]);
        assert!(m.matches("a.bc"));
        assert!(!m.matches("axb"), "`.` is literal");
        // In the regex form `**` stops at a newline, `*` does not.
        let m = matcher(&["a/**/b?"]);
        assert!(!m.matches("a/x\ny/bc"));
        assert!(matcher(&["a*b?"]).matches("a\nbc"));
        assert!(matcher(&["**"]).matches("anything/at/all"));
    }

    #[test]
    fn classes_and_escapes() {
        let m = matcher(&["file[0-9].txt"]);
        assert!(m.matches("file7.txt"));
        assert!(!m.matches("filex.txt"));
        let m = matcher(&["[^a]*"]);
        assert!(m.matches("bcd"));
        assert!(!m.matches("abc"));
        let m = matcher(&["[!a]"]);
        assert!(m.matches("!"), "only `^` negates in Docker's syntax");
        assert!(m.matches("a"));
        assert!(!m.matches("b"));
        let m = matcher(&["\\*.txt"]);
        assert!(m.matches("*.txt"));
        assert!(!m.matches("a.txt"));
        let m = matcher(&["a]"]);
        assert!(m.matches("a]"));
        // A bracket may match `/`, as it does for moby's regex.
        assert!(matcher(&["a[^x]b"]).matches("a/b"));
    }

    #[test]
    fn invalid_patterns_are_refused_naming_the_pattern() {
        assert!(error("[").contains("'['"));
        assert!(error("[").contains("syntax error in pattern"));
        assert!(error("a\\").contains("syntax error in pattern"));
        assert!(error("[]a]").contains("syntax error"));
        assert!(error("!").contains("illegal exclusion pattern"));
        assert!(error("  !  ").contains("illegal exclusion pattern"));
        assert!(error("x[z-a]").contains("bad character range z-a"));
        assert!(
            error("[z-a][").contains("syntax error"),
            "syntax errors are reported before ranges"
        );
    }

    #[test]
    fn comments_and_blank_patterns_are_skipped() {
        let m = matcher(&["# a comment", "", "   ", "  *.tmp  "]);
        assert_eq!(m.patterns(), vec!["*.tmp".to_string()]);
        assert!(m.matches("x.tmp"));
        assert!(!IgnoreMatcher::default().matches("anything"));
    }

    #[test]
    fn parse_dockerignore_follows_read_dockerignore() {
        let content = "\u{feff}# comment\r\n*.log\r\n\n  !keep.log  \rbuild/\n  # indented\n\t\n";
        assert_eq!(
            parse_dockerignore(content),
            vec!["*.log", "!keep.log", "build/", "# indented"]
        );
        // The indented comment survives parsing but the matcher skips it, as the SDK's does.
        let m = IgnoreMatcher::new(&parse_dockerignore(content)).unwrap();
        assert_eq!(m.patterns(), vec!["*.log", "!keep.log", "build"]);
        assert_eq!(parse_dockerignore("a\u{1f}\n"), vec!["a"]);
    }

    #[test]
    fn absolute_patterns_inside_the_context_become_relative() {
        assert_eq!(anchor_to_context("/ctx/app/build", "/ctx"), "app/build");
        assert_eq!(anchor_to_context(" ! /ctx/app/../x/ ", "/ctx"), "!x");
        assert_eq!(anchor_to_context("/ctx", "/ctx"), "/ctx");
        assert_eq!(anchor_to_context("/other/x", "/ctx"), "/other/x");
        assert_eq!(anchor_to_context("/ctxx/y", "/ctx"), "/ctxx/y");
        assert_eq!(anchor_to_context("build", "/ctx"), "build");
        assert_eq!(anchor_to_context("/x", "/"), "x");
        let m = IgnoreMatcher::for_context(&["/ctx/app/*.tmp".to_string()], "/ctx").unwrap();
        assert!(m.matches("app/a.tmp"));
    }
}
