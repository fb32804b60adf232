//! From Dockerfile text to logical lines: parser directives, comments, line continuations and
//! heredoc bodies, each logical line keeping the number of the line it starts on (every error
//! names it).

use super::DockerfileError;

/// One instruction's text after continuations are joined, with the heredoc bodies that follow
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalLine {
    /// 1-based number of the physical line the instruction starts on.
    pub line: usize,
    /// The keyword as written (case kept for messages).
    pub keyword: String,
    /// Everything after the keyword, continuations joined, leading whitespace trimmed.
    pub rest: String,
    pub heredocs: Vec<Heredoc>,
}

/// `<<EOF` … `EOF` after a RUN, COPY or ADD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heredoc {
    pub delimiter: String,
    /// The body, every line ending in `\n`, tabs stripped for `<<-`.
    pub body: String,
    /// A quoted delimiter (`<<"EOF"`, `<<'EOF'`) means no expansion of the body.
    pub quoted: bool,
    /// `<<-`: leading tabs are stripped.
    pub strip_tabs: bool,
}

/// The directives a Dockerfile may open with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directives {
    /// The escape character: `\` unless `# escape=` set a backtick.
    pub escape: char,
    /// `# syntax=`: recorded; strata's parser is the only frontend.
    pub syntax: Option<String>,
}

/// Splits `text` into logical lines.
pub fn logical_lines(text: &str) -> Result<(Directives, Vec<LogicalLine>), DockerfileError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let physical: Vec<&str> = text.lines().collect();
    let mut directives = Directives {
        escape: '\\',
        syntax: None,
    };
    let mut i = 0;
    // Directives: `# key=value` lines at the very top, before any blank line, comment or
    // instruction.
    while i < physical.len() {
        let Some((key, value)) = directive(physical[i]) else {
            break;
        };
        match key.as_str() {
            "escape" => {
                directives.escape = match value.as_str() {
                    "\\" => '\\',
                    "`" => '`',
                    other => {
                        return Err(DockerfileError::at(
                            i + 1,
                            format!("invalid escape character {other:?}: use \\ or `"),
                        ))
                    }
                }
            }
            "syntax" => directives.syntax = Some(value),
            // `check` and unknown directives are comments, as in BuildKit.
            _ => {}
        }
        i += 1;
    }
    let escape = directives.escape;
    let mut lines = Vec::new();
    while i < physical.len() {
        let first = physical[i];
        let start = i + 1;
        i += 1;
        let trimmed = first.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let mut joined = String::new();
        let mut current = first;
        loop {
            let (content, continues) = continuation(current, escape);
            joined.push_str(content);
            if !continues {
                break;
            }
            // Comments and blank lines inside a continuation are dropped (Docker does the same,
            // with a warning for blank ones).
            loop {
                match physical.get(i) {
                    None => {
                        return Err(DockerfileError::at(
                            start,
                            "the instruction ends with a line continuation and nothing follows",
                        ))
                    }
                    Some(next) if next.trim().is_empty() || next.trim_start().starts_with('#') => {
                        i += 1
                    }
                    Some(_) => break,
                }
            }
            current = physical[i];
            i += 1;
        }
        let joined = joined.trim();
        let (keyword, rest) = match joined.find(char::is_whitespace) {
            Some(at) => (&joined[..at], joined[at..].trim_start()),
            None => (joined, ""),
        };
        let mut heredocs = Vec::new();
        if matches!(
            keyword.to_ascii_uppercase().as_str(),
            "RUN" | "COPY" | "ADD"
        ) {
            for opener in heredoc_openers(rest) {
                let mut body = String::new();
                loop {
                    let Some(line) = physical.get(i) else {
                        return Err(DockerfileError::at(
                            start,
                            format!("the heredoc <<{} is never closed", opener.delimiter),
                        ));
                    };
                    i += 1;
                    let line = if opener.strip_tabs {
                        line.trim_start_matches('\t')
                    } else {
                        line
                    };
                    if line == opener.delimiter {
                        break;
                    }
                    body.push_str(line);
                    body.push('\n');
                }
                heredocs.push(Heredoc { body, ..opener });
            }
        }
        lines.push(LogicalLine {
            line: start,
            keyword: keyword.to_string(),
            rest: rest.to_string(),
            heredocs,
        });
    }
    Ok((directives, lines))
}

/// `# key=value` (lower-cased key), or `None` when the line is no directive.
fn directive(line: &str) -> Option<(String, String)> {
    let body = line.trim().strip_prefix('#')?.trim();
    let (key, value) = body.split_once('=')?;
    let key = key.trim();
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    Some((key.to_ascii_lowercase(), value.trim().to_string()))
}

/// The line without a trailing escape character, and whether it had one.
fn continuation(line: &str, escape: char) -> (&str, bool) {
    let trimmed = line.trim_end();
    match trimmed.strip_suffix(escape) {
        // An escaped escape character (`\\` at the end) is no continuation.
        Some(before) if !before.ends_with(escape) => (before, true),
        _ => (line, false),
    }
}

/// The heredocs `rest` opens, in order: `<<EOF`, `<<-EOF`, `<<"EOF"`, `<<'EOF'`. A `<<` inside
/// quotes or followed by no word opens none.
fn heredoc_openers(rest: &str) -> Vec<Heredoc> {
    let chars: Vec<char> = rest.chars().collect();
    let mut openers = Vec::new();
    let mut quote: Option<char> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '<'
                && chars.get(i + 1) == Some(&'<')
                && chars.get(i + 2) != Some(&'<') =>
            {
                let mut j = i + 2;
                let strip_tabs = chars.get(j) == Some(&'-');
                if strip_tabs {
                    j += 1;
                }
                let quoted_by = chars.get(j).copied().filter(|c| *c == '"' || *c == '\'');
                if quoted_by.is_some() {
                    j += 1;
                }
                let begin = j;
                while j < chars.len()
                    && (chars[j].is_alphanumeric() || chars[j] == '_' || chars[j] == '-')
                {
                    j += 1;
                }
                let word: String = chars[begin..j].iter().collect();
                if let Some(q) = quoted_by {
                    if chars.get(j) != Some(&q) {
                        i += 1;
                        continue;
                    }
                    j += 1;
                }
                if !word.is_empty() {
                    openers.push(Heredoc {
                        delimiter: word,
                        body: String::new(),
                        quoted: quoted_by.is_some(),
                        strip_tabs,
                    });
                    i = j;
                    continue;
                }
            }
            None => {}
        }
        i += 1;
    }
    openers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<LogicalLine> {
        logical_lines(text).unwrap().1
    }

    #[test]
    fn continuations_join_and_comments_inside_them_drop() {
        let got = lines("FROM a\n\n# c\nRUN echo one \\\n  # inner comment\n\n  two\nENV A=1\n");
        assert_eq!(got.len(), 3);
        assert_eq!(got[1].line, 4);
        assert_eq!(got[1].keyword, "RUN");
        assert_eq!(got[1].rest, "echo one   two");
        assert_eq!(got[2].line, 8);
    }

    #[test]
    fn the_escape_directive_switches_the_continuation_character() {
        let (d, got) = logical_lines("# escape=`\nFROM a\nRUN dir c:\\ `\n  /w\n").unwrap();
        assert_eq!(d.escape, '`');
        assert_eq!(got[1].rest, "dir c:\\   /w");
        // Directives after an instruction are comments.
        let (d, _) = logical_lines("FROM a\n# escape=`\n").unwrap();
        assert_eq!(d.escape, '\\');
        assert!(logical_lines("# escape=x\nFROM a\n").is_err());
    }

    #[test]
    fn heredocs_collect_their_bodies_and_keep_line_numbers() {
        let text = "FROM a\nRUN <<EOF\necho hi\n  x\nEOF\nRUN cat <<-'END' >/f\n\tkeep $A\n\tEND\nUSER u\n";
        let got = lines(text);
        assert_eq!(got.len(), 4);
        assert_eq!(got[1].heredocs[0].body, "echo hi\n  x\n");
        assert!(!got[1].heredocs[0].quoted);
        let h = &got[2].heredocs[0];
        assert_eq!(
            (h.body.as_str(), h.quoted, h.strip_tabs),
            ("keep $A\n", true, true)
        );
        assert_eq!(got[3].line, 9);
        let err = logical_lines("FROM a\nRUN <<EOF\necho\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        // `<<` inside quotes opens nothing.
        assert!(lines("RUN echo '<<EOF'\n")[0].heredocs.is_empty());
    }

    #[test]
    fn a_trailing_continuation_with_nothing_after_is_an_error_naming_its_line() {
        let err = logical_lines("FROM a\nRUN echo \\\n").unwrap_err();
        assert_eq!(err.line, Some(2));
    }
}
