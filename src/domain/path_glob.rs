//! Glob matching over path names, in the two dialects a COPY source meets on its way to the
//! E2B build protocol, sharing one backtracking engine:
//! * the `.dockerignore` dialect ([`parse_docker_class`], used by
//!   [`super::ignore_pattern`]): Go's `filepath.Match` syntax, rejected where Go rejects it,
//!   because Docker (and the SDK's port of moby's matcher) refuse the whole build on a bad
//!   pattern rather than guessing;
//! * the COPY-source dialect ([`parse_source`], [`SegmentPattern`]): what the Python SDK's
//!   `wcmatch.glob(src, GLOBSTAR | DOTMATCH)` accepts, which never rejects: a `[` that does not
//!   close is a literal `[`, and both `[!x]` and `[^x]` negate.
//!
//! Also the lexical path cleaning both need ([`normpath`]): the SDK compares and anchors paths
//! with Python's `posixpath.normpath`, so ours must clean identically or the same source would
//! select different files.
//!
//! Matching works on `char`s (Python compares code points) and never touches the file system.

use std::collections::HashSet;

/// One element of a compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    Literal(char),
    /// `?`: one character other than `/`.
    AnyChar,
    /// `*`: any run of characters other than `/`.
    Star,
    Class(CharClass),
    /// A trailing `**` in a `.dockerignore` pattern: any run of characters except a newline
    /// (moby compiles it to the regex `.*`, and the SDK keeps that quirk).
    AnyRun,
    /// `**/` inside a `.dockerignore` pattern: nothing, or any run of characters except a
    /// newline followed by `/` (the regex `(.*/)?`).
    DirPrefix,
}

/// A bracket expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharClass {
    pub negated: bool,
    pub items: Vec<ClassItem>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassItem {
    Char(char),
    /// Inclusive; a reversed range (only accepted by the COPY dialect) matches nothing.
    Range(char, char),
    /// `[:alpha:]` and friends (COPY dialect only), ASCII as wcmatch defines them.
    Posix(PosixClass),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PosixClass {
    Alnum,
    Alpha,
    Ascii,
    Blank,
    Cntrl,
    Digit,
    Graph,
    Lower,
    Print,
    Punct,
    Space,
    Upper,
    Word,
    Xdigit,
}

impl PosixClass {
    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "alnum" => Self::Alnum,
            "alpha" => Self::Alpha,
            "ascii" => Self::Ascii,
            "blank" => Self::Blank,
            "cntrl" => Self::Cntrl,
            "digit" => Self::Digit,
            "graph" => Self::Graph,
            "lower" => Self::Lower,
            "print" => Self::Print,
            "punct" => Self::Punct,
            "space" => Self::Space,
            "upper" => Self::Upper,
            "word" => Self::Word,
            "xdigit" => Self::Xdigit,
            _ => return None,
        })
    }

    fn contains(self, c: char) -> bool {
        match self {
            Self::Alnum => c.is_ascii_alphanumeric(),
            Self::Alpha => c.is_ascii_alphabetic(),
            Self::Ascii => c.is_ascii(),
            Self::Blank => c == ' ' || c == '\t',
            Self::Cntrl => c.is_ascii_control(),
            Self::Digit => c.is_ascii_digit(),
            Self::Graph => c.is_ascii_graphic(),
            Self::Lower => c.is_ascii_lowercase(),
            Self::Print => c.is_ascii_graphic() || c == ' ',
            Self::Punct => c.is_ascii_punctuation(),
            Self::Space => matches!(c, '\t'..='\r' | ' '),
            Self::Upper => c.is_ascii_uppercase(),
            Self::Word => c.is_ascii_alphanumeric() || c == '_',
            Self::Xdigit => c.is_ascii_hexdigit(),
        }
    }
}

impl CharClass {
    /// The first range written backwards (`z-a`), if any.
    pub fn reversed_range(&self) -> Option<(char, char)> {
        self.items.iter().find_map(|item| match *item {
            ClassItem::Range(lo, hi) if hi < lo => Some((lo, hi)),
            _ => None,
        })
    }

    pub fn contains(&self, c: char) -> bool {
        let hit = self.items.iter().any(|item| match *item {
            ClassItem::Char(x) => x == c,
            ClassItem::Range(lo, hi) => lo <= c && c <= hi,
            ClassItem::Posix(p) => p.contains(c),
        });
        hit != self.negated
    }
}

/// A pattern Go's `filepath.Match` (and so Docker) refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobSyntaxError {
    /// Go's `ErrBadPattern`, worded as the SDK words it.
    #[error("syntax error in pattern")]
    Syntax,
    /// Go accepts `[z-a]` (it matches nothing) but the SDK hands the bracket to Python's `re`,
    /// which refuses it; refusing too keeps a build that fails under the SDK failing here.
    #[error("bad character range {0}-{1}")]
    ReversedRange(char, char),
}

/// Whether `tokens` match all of `text`.
pub fn match_tokens(tokens: &[Token], text: &[char]) -> bool {
    // Failed (token, position) pairs: without them a pattern with several stars backtracks
    // exponentially on a long name that almost matches.
    let mut failed = HashSet::new();
    match_from(tokens, text, 0, 0, &mut failed)
}

fn match_from(
    tokens: &[Token],
    text: &[char],
    ti: usize,
    ci: usize,
    failed: &mut HashSet<(usize, usize)>,
) -> bool {
    if failed.contains(&(ti, ci)) {
        return false;
    }
    let hit = match tokens.get(ti) {
        None => ci == text.len(),
        Some(token) => match token {
            Token::Literal(l) => {
                text.get(ci) == Some(l) && match_from(tokens, text, ti + 1, ci + 1, failed)
            }
            Token::AnyChar => {
                matches!(text.get(ci), Some(c) if *c != '/')
                    && match_from(tokens, text, ti + 1, ci + 1, failed)
            }
            Token::Class(class) => {
                matches!(text.get(ci), Some(c) if class.contains(*c))
                    && match_from(tokens, text, ti + 1, ci + 1, failed)
            }
            Token::Star => run_then(tokens, text, ti, ci, failed, |c| c != '/', false),
            Token::AnyRun => run_then(tokens, text, ti, ci, failed, |c| c != '\n', false),
            Token::DirPrefix => {
                match_from(tokens, text, ti + 1, ci, failed)
                    || run_then(tokens, text, ti, ci, failed, |c| c != '\n', true)
            }
        },
    };
    if !hit {
        failed.insert((ti, ci));
    }
    hit
}

/// Tries every length of a run of `allowed` characters starting at `ci` (followed by a `/`
/// when `then_slash`), then the rest of the pattern.
fn run_then(
    tokens: &[Token],
    text: &[char],
    ti: usize,
    ci: usize,
    failed: &mut HashSet<(usize, usize)>,
    allowed: impl Fn(char) -> bool,
    then_slash: bool,
) -> bool {
    let mut end = ci;
    loop {
        if then_slash {
            if text.get(end) == Some(&'/') && match_from(tokens, text, ti + 1, end + 1, failed) {
                return true;
            }
        } else if match_from(tokens, text, ti + 1, end, failed) {
            return true;
        }
        match text.get(end) {
            Some(c) if allowed(*c) => end += 1,
            _ => return false,
        }
    }
}

/// Parses the bracket expression opening at `chars[open]` (a `[`) the way Go's
/// `filepath.Match` validates it: an optional `^`, then one or more characters or ranges, a
/// backslash escaping the next character. Returns the class and the index after its `]`.
/// Reversed ranges pass here, as they pass Go; see [`CharClass::reversed_range`].
pub fn parse_docker_class(
    chars: &[char],
    open: usize,
) -> Result<(CharClass, usize), GlobSyntaxError> {
    let mut i = open + 1;
    let negated = chars.get(i) == Some(&'^');
    if negated {
        i += 1;
    }
    let mut items = Vec::new();
    loop {
        if !items.is_empty() && chars.get(i) == Some(&']') {
            return Ok((CharClass { negated, items }, i + 1));
        }
        let (lo, next) = docker_class_char(chars, i)?;
        i = next;
        if chars[i] == '-' {
            let (hi, next) = docker_class_char(chars, i + 1)?;
            i = next;
            items.push(ClassItem::Range(lo, hi));
        } else {
            items.push(ClassItem::Char(lo));
        }
    }
}

/// One (possibly escaped) character of a bracket expression; something must follow it, as
/// the expression still has to close.
fn docker_class_char(chars: &[char], mut i: usize) -> Result<(char, usize), GlobSyntaxError> {
    match chars.get(i) {
        None | Some('-') | Some(']') => return Err(GlobSyntaxError::Syntax),
        Some('\\') => i += 1,
        Some(_) => {}
    }
    let c = *chars.get(i).ok_or(GlobSyntaxError::Syntax)?;
    i += 1;
    if i >= chars.len() {
        return Err(GlobSyntaxError::Syntax);
    }
    Ok((c, i))
}

/// One `/`-free segment of a COPY source that holds a wildcard, compiled as wcmatch compiles
/// it for `glob(GLOBSTAR | DOTMATCH)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentPattern {
    tokens: Vec<Token>,
}

impl SegmentPattern {
    pub fn parse(segment: &str) -> Self {
        let chars: Vec<char> = segment.chars().collect();
        let mut tokens = Vec::new();
        // wcmatch stops trying bracket expressions once one ran off the end unclosed: every
        // later `[` is then literal, even one that would close.
        let mut unclosed_seen = false;
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            i += 1;
            match c {
                '*' => {
                    if tokens.last() != Some(&Token::Star) {
                        tokens.push(Token::Star);
                    }
                }
                '?' => tokens.push(Token::AnyChar),
                // An escape of nothing (a trailing backslash) is dropped.
                '\\' => {
                    if let Some(&next) = chars.get(i) {
                        tokens.push(Token::Literal(next));
                        i += 1;
                    }
                }
                '[' if !unclosed_seen => match parse_copy_class(&chars, i) {
                    Some((class, next)) => {
                        tokens.push(Token::Class(class));
                        i = next;
                    }
                    None => {
                        unclosed_seen = true;
                        tokens.push(Token::Literal('['));
                    }
                },
                _ => tokens.push(Token::Literal(c)),
            }
        }
        Self { tokens }
    }

    /// wcmatch never lets a wildcard match `.` or `..` (NODOTDIR): only a segment spelling
    /// one of them literally (e.g. `\.`) does.
    pub fn matches(&self, name: &str) -> bool {
        let chars: Vec<char> = name.chars().collect();
        if name == "." || name == ".." {
            return self.tokens.len() == chars.len()
                && self
                    .tokens
                    .iter()
                    .zip(&chars)
                    .all(|(t, c)| *t == Token::Literal(*c));
        }
        match_tokens(&self.tokens, &chars)
    }
}

/// Parses a wcmatch bracket expression whose `[` ends just before `chars[start]`. `None`
/// when it never closes (the caller then reads the `[` literally).
fn parse_copy_class(chars: &[char], start: usize) -> Option<(CharClass, usize)> {
    let mut i = start;
    let negated = matches!(chars.get(i), Some('!') | Some('^'));
    if negated {
        i += 1;
    }
    let mut items: Vec<ClassItem> = Vec::new();
    // The previous item may start a range: a plain character that did not end one.
    let mut range_start: Option<char> = None;
    let mut first = true;
    loop {
        let c = *chars.get(i)?;
        if c == ']' && !first {
            return Some((CharClass { negated, items }, i + 1));
        }
        let at_first = first;
        first = false;
        if c == '[' {
            if let Some((class, next)) = posix_class(chars, i) {
                items.push(ClassItem::Posix(class));
                range_start = None;
                i = next;
                continue;
            }
        }
        if c == '-' && !at_first {
            if let Some(lo) = range_start {
                // A `-` before the closing `]` is literal (`[a-]`); otherwise the next
                // character, whatever it is, ends the range.
                match chars.get(i + 1) {
                    None => return None,
                    Some(']') => {
                        items.push(ClassItem::Char('-'));
                        i += 1;
                        range_start = None;
                        continue;
                    }
                    Some('[') if posix_class(chars, i + 1).is_some() => {
                        let (class, next) = posix_class(chars, i + 1)?;
                        items.push(ClassItem::Char('-'));
                        items.push(ClassItem::Posix(class));
                        i = next;
                        range_start = None;
                        continue;
                    }
                    Some(_) => {
                        let (hi, next) = copy_class_char(chars, i + 1)?;
                        items.pop();
                        items.push(ClassItem::Range(lo, hi));
                        i = next;
                        range_start = None;
                        continue;
                    }
                }
            }
        }
        let (ch, next) = copy_class_char(chars, i)?;
        items.push(ClassItem::Char(ch));
        range_start = Some(ch);
        i = next;
    }
}

/// One character of a wcmatch bracket expression, a backslash escaping the next one.
fn copy_class_char(chars: &[char], i: usize) -> Option<(char, usize)> {
    match *chars.get(i)? {
        '\\' => Some((*chars.get(i + 1)?, i + 2)),
        c => Some((c, i + 1)),
    }
}

/// `[:name:]` at `chars[i]`.
fn posix_class(chars: &[char], i: usize) -> Option<(PosixClass, usize)> {
    if chars.get(i + 1) != Some(&':') {
        return None;
    }
    let rest = &chars[i + 2..];
    let close = rest.iter().position(|c| *c == ':')?;
    if rest.get(close + 1) != Some(&']') {
        return None;
    }
    let name: String = rest[..close].iter().collect();
    PosixClass::from_name(&name).map(|class| (class, i + 2 + close + 2))
}

/// One `/`-separated part of a COPY source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSegment {
    /// `**` as a whole segment: zero or more directories, never entering a symlinked one.
    Globstar,
    /// No wildcard: the entry of that exact name (also `.` and `..`).
    Literal(String),
    Pattern(SegmentPattern),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcePart {
    pub segment: SourceSegment,
    /// More follows (or the source ends in `/`): only directories match this part.
    pub dir_only: bool,
}

/// A COPY source split the way wcmatch splits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceGlob {
    /// Starts with `/`; such sources are refused before anything is matched.
    pub absolute: bool,
    /// Empty for an empty source (which matches nothing). Repeated `/` and repeated `**`
    /// parts collapse.
    pub parts: Vec<SourcePart>,
}

/// Characters that make wcmatch compile a segment instead of comparing it (`]` included).
fn is_magic(segment: &str) -> bool {
    segment.contains(['*', '?', '[', ']', '\\'])
}

pub fn parse_source(src: &str) -> SourceGlob {
    let absolute = src.starts_with('/');
    let body = if absolute { &src[1..] } else { src };
    // wcmatch splits on every `/`, an escaped one (`\/`) included; a backslash escaping
    // another backslash is kept whole so `\\/` still splits after the pair.
    let mut raw: Vec<String> = vec![String::new()];
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' => raw.push(String::new()),
            '\\' => match chars.peek() {
                Some('/') => {
                    chars.next();
                    raw.push(String::new());
                }
                Some(_) => {
                    let escaped = chars.next().unwrap_or_default();
                    let last = raw.last_mut().expect("never empty");
                    last.push('\\');
                    last.push(escaped);
                }
                None => raw.last_mut().expect("never empty").push('\\'),
            },
            _ => raw.last_mut().expect("never empty").push(c),
        }
    }
    // A relative source opening with `\/` leaves wcmatch an empty first part, which it
    // treats as "nothing to look in".
    if !absolute && raw[0].is_empty() {
        return SourceGlob {
            absolute,
            parts: Vec::new(),
        };
    }
    let count = raw.len();
    let mut parts: Vec<SourcePart> = Vec::new();
    for (index, value) in raw.into_iter().enumerate() {
        if value.is_empty() {
            continue;
        }
        let dir_only = index + 1 < count;
        let segment = if value == "**" {
            SourceSegment::Globstar
        } else if is_magic(&value) {
            SourceSegment::Pattern(SegmentPattern::parse(&value))
        } else {
            SourceSegment::Literal(value)
        };
        if segment == SourceSegment::Globstar
            && parts.last().map(|p| &p.segment) == Some(&SourceSegment::Globstar)
        {
            parts.last_mut().expect("checked").dir_only = dir_only;
            continue;
        }
        parts.push(SourcePart { segment, dir_only });
    }
    SourceGlob { absolute, parts }
}

/// Python's `posixpath.normpath`: drops `.` and empty segments and folds `..` into its
/// parent, lexically (symlinks are not consulted); `""` becomes `"."`, leading `..` of a
/// relative path stay, and exactly two leading slashes are kept as POSIX allows.
pub fn normpath(path: &str) -> String {
    if path.is_empty() {
        return ".".into();
    }
    let leading = path.chars().take_while(|c| *c == '/').count();
    let prefix = match leading {
        0 => "",
        2 => "//",
        _ => "/",
    };
    let mut out: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|last| *last != "..") {
                    out.pop();
                } else if prefix.is_empty() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    let joined = format!("{prefix}{}", out.join("/"));
    if joined.is_empty() {
        ".".into()
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(pattern: &str, name: &str) -> bool {
        SegmentPattern::parse(pattern).matches(name)
    }

    fn docker_class(pattern: &str) -> Result<CharClass, GlobSyntaxError> {
        let chars: Vec<char> = pattern.chars().collect();
        parse_docker_class(&chars, 0).map(|(class, end)| {
            assert_eq!(end, chars.len(), "{pattern}");
            class
        })
    }

    #[test]
    fn star_and_question_mark_stay_within_a_segment_and_match_dotfiles() {
        assert!(seg("*.txt", "a.txt"));
        assert!(seg("*.txt", ".h.txt"));
        assert!(seg("*", ".hidden"));
        assert!(!seg("*.txt", "a.TXT"));
        assert!(seg("a?p", "app"));
        assert!(!seg("a?p", "ap"));
        assert!(seg("a*b*c", "aXbYc"));
        assert!(!seg("a*b*c", "aXbY"));
        assert!(seg("**x", "yx"), "a `**` inside a segment is a plain star");
    }

    #[test]
    fn wildcards_never_match_the_dot_directories() {
        for pattern in ["*", "?", ".*", "?.", "[.]", "..*", ".[.]"] {
            assert!(!seg(pattern, "."), "{pattern}");
            assert!(!seg(pattern, ".."), "{pattern}");
        }
        assert!(seg("\\.", "."));
        assert!(seg("..*", "..x"));
        assert!(seg(".*", ".x"));
    }

    #[test]
    fn copy_classes_negate_with_either_bang_or_caret() {
        assert!(seg("a[!x]p", "app"));
        assert!(seg("a[^x]p", "app"));
        assert!(!seg("a[!p]p", "app"));
        assert!(seg("a[b-z]p", "app"));
        assert!(!seg("a[b-o]p", "app"));
        assert!(seg("[[:alpha:]]pp", "app"));
        assert!(!seg("[[:digit:]]pp", "app"));
        assert!(seg("[a-]pp", "-pp"), "a `-` before `]` is literal");
        assert!(seg("[]]", "]"));
        assert!(seg("[a-c-e]", "-"));
        assert!(!seg("[a-c-e]", "d"));
        assert!(!seg("[z-a]", "m"), "a reversed range matches nothing");
        assert!(seg("[!z-a]", "m"));
        assert!(seg("[\\]]", "]"));
    }

    #[test]
    fn copy_brackets_that_never_close_are_literal() {
        assert!(seg("ap[", "ap["));
        assert!(seg("[]", "[]"));
        assert!(seg("[!]", "[!]"));
        // After one unclosed `[`, wcmatch no longer tries a later one.
        assert!(seg("[x[:alpha:]", "[x[:alpha:]"));
    }

    #[test]
    fn copy_escapes_are_literal_and_a_trailing_backslash_is_dropped() {
        assert!(seg("\\[x].txt", "[x].txt"));
        assert!(seg("a\\pp", "app"));
        assert!(seg("a\\*", "a*"));
        assert!(!seg("a\\*", "ab"));
        assert!(seg("ab\\", "ab"));
        assert!(seg("a]", "a]"));
    }

    #[test]
    fn sources_split_into_parts() {
        let g = parse_source("app//sub/**/**/*.py");
        assert!(!g.absolute);
        assert_eq!(g.parts.len(), 4);
        assert_eq!(g.parts[0].segment, SourceSegment::Literal("app".into()));
        assert!(g.parts[0].dir_only);
        assert_eq!(g.parts[2].segment, SourceSegment::Globstar);
        assert!(!g.parts[3].dir_only);
        let g = parse_source("app/");
        assert_eq!(g.parts.len(), 1);
        assert!(
            g.parts[0].dir_only,
            "a trailing slash keeps only directories"
        );
        assert!(parse_source("/etc").absolute);
        assert!(parse_source("").parts.is_empty());
        let g = parse_source("a\\/b");
        assert_eq!(g.parts.len(), 2, "an escaped slash still splits");
        assert!(parse_source("\\/x").parts.is_empty());
        let g = parse_source("a]");
        assert!(matches!(g.parts[0].segment, SourceSegment::Pattern(_)));
    }

    #[test]
    fn docker_classes_follow_go_filepath_match() {
        let c = docker_class("[a-z]").unwrap();
        assert!(c.contains('m') && !c.contains('A'));
        let c = docker_class("[^x]").unwrap();
        assert!(c.contains('y') && !c.contains('x') && c.contains('/'));
        let c = docker_class("[!x]").unwrap();
        assert!(
            c.contains('!') && c.contains('x') && !c.contains('y'),
            "`!` is literal to Go"
        );
        let c = docker_class("[\\]]").unwrap();
        assert!(c.contains(']'));
        let c = docker_class("[\\--z]").unwrap();
        assert!(c.contains('-') && c.contains('a'));
        for bad in [
            "[", "[]", "[a", "[-a]", "[a-]", "[]a]", "[^]", "[a-\\", "[\\",
        ] {
            assert_eq!(
                docker_class(bad).unwrap_err(),
                GlobSyntaxError::Syntax,
                "{bad}"
            );
        }
        assert_eq!(
            docker_class("[a-cz-a]").unwrap().reversed_range(),
            Some(('z', 'a'))
        );
        assert_eq!(docker_class("[a-c]").unwrap().reversed_range(), None);
    }

    #[test]
    fn match_tokens_handles_many_stars_quickly() {
        let tokens: Vec<Token> = "*a*a*a*a*a*a*a*b"
            .chars()
            .map(|c| {
                if c == '*' {
                    Token::Star
                } else {
                    Token::Literal(c)
                }
            })
            .collect();
        let text: Vec<char> = "a".repeat(200).chars().collect();
        assert!(!match_tokens(&tokens, &text));
    }

    #[test]
    fn dir_prefix_and_any_run_stop_at_newlines() {
        let tokens = [Token::DirPrefix, Token::Literal('x')];
        let text = |s: &str| s.chars().collect::<Vec<_>>();
        assert!(match_tokens(&tokens, &text("x")));
        assert!(match_tokens(&tokens, &text("a/b/x")));
        assert!(!match_tokens(&tokens, &text("a\n/x")));
        assert!(!match_tokens(&tokens, &text("ax")));
        let tokens = [Token::Literal('a'), Token::AnyRun];
        assert!(match_tokens(&tokens, &text("a/b/c")));
        assert!(!match_tokens(&tokens, &text("a\nb")));
    }

    #[test]
    fn normpath_matches_python() {
        for (input, want) in [
            ("", "."),
            (".", "."),
            ("./app", "app"),
            ("app/", "app"),
            ("a/../b", "b"),
            ("a/./b//c", "a/b/c"),
            ("../a", "../a"),
            ("a/../../b", "../b"),
            ("/../a", "/a"),
            ("//a", "//a"),
            ("///a/", "/a"),
            ("..myconfig", "..myconfig"),
            ("a/..", "."),
        ] {
            assert_eq!(normpath(input), want, "{input:?}");
        }
    }
}
