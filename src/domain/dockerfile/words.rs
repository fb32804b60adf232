//! Docker's word rules: splitting an instruction's arguments on whitespace outside quotes, and
//! expanding `$VAR`, `${VAR}` and `${VAR:-word}`-style references against the build's variables
//! while removing quotes, as BuildKit does for FROM, COPY, ENV, ARG, WORKDIR, USER, LABEL,
//! EXPOSE and VOLUME (RUN, CMD and ENTRYPOINT are left to the shell).

/// Splits on whitespace outside quotes; quotes and escapes stay in the words, for [`expand`].
pub fn split_words(input: &str, escape: char) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = input.chars();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                word.push(c);
                if c == q {
                    quote = None;
                } else if c == escape && q == '"' {
                    if let Some(next) = chars.next() {
                        word.push(next);
                    }
                }
            }
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            None => {
                in_word = true;
                word.push(c);
                if c == '\'' || c == '"' {
                    quote = Some(c);
                } else if c == escape {
                    if let Some(next) = chars.next() {
                        word.push(next);
                    }
                }
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Expands one word: quotes removed, escapes applied, variables substituted (an unset one is
/// empty). `Err` says what is wrong with the word.
pub fn expand(
    word: &str,
    vars: &dyn Fn(&str) -> Option<String>,
    escape: char,
) -> Result<String, String> {
    let chars: Vec<char> = word.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        if c == escape {
            match chars.get(i) {
                Some(next) => {
                    out.push(*next);
                    i += 1;
                }
                None => out.push(c),
            }
        } else if c == '\'' {
            let end = find(&chars, i, '\'').ok_or("a single quote is never closed")?;
            out.extend(&chars[i..end]);
            i = end + 1;
        } else if c == '"' {
            loop {
                match chars.get(i) {
                    None => return Err("a double quote is never closed".into()),
                    Some('"') => {
                        i += 1;
                        break;
                    }
                    Some(&e) if e == escape => match chars.get(i + 1) {
                        Some(&n) if n == '"' || n == '$' || n == escape => {
                            out.push(n);
                            i += 2;
                        }
                        _ => {
                            out.push(e);
                            i += 1;
                        }
                    },
                    Some('$') => {
                        i += 1;
                        i = reference(&chars, i, vars, escape, &mut out)?;
                    }
                    Some(&other) => {
                        out.push(other);
                        i += 1;
                    }
                }
            }
        } else if c == '$' {
            i = reference(&chars, i, vars, escape, &mut out)?;
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// Expands references in free text (an unquoted heredoc body): no quote removal, and only an
/// escaped `$` loses its escape character.
pub fn expand_text(
    text: &str,
    vars: &dyn Fn(&str) -> Option<String>,
    escape: char,
) -> Result<String, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        if c == escape && chars.get(i) == Some(&'$') {
            out.push('$');
            i += 1;
        } else if c == '$' {
            i = reference(&chars, i, vars, escape, &mut out)?;
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

fn find(chars: &[char], from: usize, wanted: char) -> Option<usize> {
    (from..chars.len()).find(|&j| chars[j] == wanted)
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands the reference after a `$` at `i` into `out`; returns where the word goes on.
fn reference(
    chars: &[char],
    mut i: usize,
    vars: &dyn Fn(&str) -> Option<String>,
    escape: char,
    out: &mut String,
) -> Result<usize, String> {
    match chars.get(i) {
        Some('{') => {
            i += 1;
            let start = i;
            while i < chars.len() && is_name_char(chars[i]) {
                i += 1;
            }
            let name: String = chars[start..i].iter().collect();
            if name.is_empty() {
                return Err("${} names no variable".into());
            }
            let value = vars(&name);
            if chars.get(i) == Some(&'}') {
                out.push_str(&value.unwrap_or_default());
                return Ok(i + 1);
            }
            // A modifier: `:-`, `:+`, `:?`, `-`, `+`, `?`, then a word up to the matching brace.
            let colon = chars.get(i) == Some(&':');
            if colon {
                i += 1;
            }
            let op = *chars.get(i).ok_or("a ${ is never closed")?;
            if !matches!(op, '-' | '+' | '?') {
                return Err(format!(
                    "the modifier {op:?} in ${{{name}…}} is not supported: use :-, :+ or :?"
                ));
            }
            i += 1;
            let mut depth = 0;
            let start = i;
            while i < chars.len() {
                match chars[i] {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    c if c == escape => i += 1,
                    _ => {}
                }
                i += 1;
            }
            if i >= chars.len() {
                return Err(format!("${{{name} is never closed"));
            }
            let raw: String = chars[start..i].iter().collect();
            let word = expand(&raw, vars, escape)?;
            let set = match &value {
                Some(v) => !(colon && v.is_empty()),
                None => false,
            };
            match op {
                '-' if set => out.push_str(&value.unwrap_or_default()),
                '-' => out.push_str(&word),
                '+' if set => out.push_str(&word),
                '+' => {}
                _ if set => out.push_str(&value.unwrap_or_default()),
                _ => {
                    return Err(if word.is_empty() {
                        format!("{name} is not set")
                    } else {
                        format!("{name}: {word}")
                    })
                }
            }
            Ok(i + 1)
        }
        Some(&c) if is_name_char(c) => {
            let start = i;
            while i < chars.len() && is_name_char(chars[i]) {
                i += 1;
            }
            let name: String = chars[start..i].iter().collect();
            out.push_str(&vars(&name).unwrap_or_default());
            Ok(i)
        }
        _ => {
            out.push('$');
            Ok(i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<String> {
        match name {
            "A" => Some("alpha".into()),
            "EMPTY" => Some(String::new()),
            "SP" => Some("two words".into()),
            _ => None,
        }
    }

    fn x(word: &str) -> String {
        expand(word, &vars, '\\').unwrap()
    }

    #[test]
    fn references_expand_as_docker_does() {
        assert_eq!(x("$A"), "alpha");
        assert_eq!(x("${A}/bin"), "alpha/bin");
        assert_eq!(x("$A-x"), "alpha-x");
        assert_eq!(x("$UNSET."), ".");
        assert_eq!(x("${UNSET:-dflt}"), "dflt");
        assert_eq!(x("${EMPTY:-dflt}"), "dflt");
        assert_eq!(x("${EMPTY-dflt}"), "");
        assert_eq!(x("${A:+set}"), "set");
        assert_eq!(x("${UNSET:+set}"), "");
        assert_eq!(x("${UNSET:-$A}"), "alpha");
        assert_eq!(x("cost $5"), "cost ");
        assert_eq!(x("a$"), "a$");
        assert!(expand("${UNSET:?must be set}", &vars, '\\')
            .unwrap_err()
            .contains("must be set"));
        assert!(expand("${A%x}", &vars, '\\').is_err());
        assert!(expand("${A", &vars, '\\').is_err());
    }

    #[test]
    fn quotes_and_escapes() {
        assert_eq!(x("'$A'"), "$A");
        assert_eq!(x("\"$A b\""), "alpha b");
        assert_eq!(x("\\$A"), "$A");
        assert_eq!(x("\"\\$A \\\"q\\\" \\n\""), "$A \"q\" \\n");
        assert_eq!(x("a\\ b"), "a b");
        assert_eq!(expand("`$A", &vars, '`').unwrap(), "$A");
        assert!(expand("'open", &vars, '\\').is_err());
    }

    #[test]
    fn free_text_expands_references_and_keeps_quotes() {
        assert_eq!(
            expand_text("say \"$A\" '${SP}' \\$A\n", &vars, '\\').unwrap(),
            "say \"alpha\" 'two words' $A\n"
        );
    }

    #[test]
    fn words_split_outside_quotes_only() {
        assert_eq!(
            split_words(r#"a "b c" 'd e'  f\ g"#, '\\'),
            vec!["a", "\"b c\"", "'d e'", "f\\ g"]
        );
        assert_eq!(split_words("  ", '\\'), Vec::<String>::new());
        assert_eq!(
            split_words("k=\"v 1\" k2=v2", '\\'),
            vec!["k=\"v 1\"", "k2=v2"]
        );
    }
}
