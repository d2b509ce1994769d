//! A deliberately small reader of the WHERE clauses of the store's statements.
//!
//! It knows one shape: a `WHERE` keyword followed by conjuncts joined with top-level `AND`, ended
//! by a clause keyword (`ORDER`, `LIMIT`, `RETURNING`, `FOR`, `GROUP`, `HAVING`, `OFFSET`), a
//! closing parenthesis, a `;` or the end of the text. Every `WHERE` is read, nested ones included
//! (a CTE's, a subquery's inside `NOT EXISTS (...)` or `ARRAY(...)`), and a parenthesised
//! conjunct is one predicate: its insides are not split. Anything else at the top level of a
//! conjunct (`OR`, `BETWEEN`, `CASE`, a `SELECT`, ...) is an error that names the statement and
//! the word, so a statement of a new shape fails loudly instead of being half read.

use std::ops::Range;

/// One top-level conjunct of one WHERE clause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Predicate {
    /// The conjunct's text with whitespace runs collapsed to one space (how witnesses name it).
    pub text: String,
    /// Its byte range in the comment-free text returned by [`strip_comments`].
    pub span: Range<usize>,
    /// 1 for the first predicate of the statement with this text, 2 for the second, ...
    pub occurrence: usize,
}

/// Words that end a WHERE clause when they stand at the clause's own depth.
const CLAUSE_END: &[&str] = &[
    "ORDER",
    "LIMIT",
    "RETURNING",
    "FOR",
    "GROUP",
    "HAVING",
    "OFFSET",
];

/// Words this reader does not understand at the top level of a conjunct.
const NOT_UNDERSTOOD: &[&str] = &[
    "OR",
    "BETWEEN",
    "CASE",
    "SELECT",
    "FROM",
    "WHERE",
    "SET",
    "UPDATE",
    "DELETE",
    "INSERT",
    "WITH",
    "JOIN",
    "ON",
    "USING",
    "VALUES",
    "UNION",
    "INTERSECT",
    "EXCEPT",
    "WINDOW",
];

/// The text with every `--` comment replaced by spaces (byte offsets are kept). Block comments
/// are refused: the statements use them only for the table placeholder, rendered away first.
pub fn strip_comments(sql: &str) -> Result<String, String> {
    let bytes = sql.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    let mut quote: Option<u8> = None;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) => {
                out.push(b);
                if b == q {
                    quote = None;
                }
                i += 1;
            }
            None if b == b'\'' || b == b'"' => {
                quote = Some(b);
                out.push(b);
                i += 1;
            }
            None if bytes[i..].starts_with(b"--") => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    out.push(b' ');
                    i += 1;
                }
            }
            None if bytes[i..].starts_with(b"/*") => {
                return Err(format!(
                    "a block comment at byte {i}: render the table placeholder before reading"
                ));
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    if quote.is_some() {
        return Err("an unterminated quoted string or identifier".to_owned());
    }
    String::from_utf8(out).map_err(|e| format!("comment stripping broke UTF-8: {e}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Word,
    Open,
    Close,
    Semicolon,
    Other,
}

#[derive(Debug, Clone)]
struct Token {
    kind: Kind,
    span: Range<usize>,
    /// Parenthesis depth outside the token (a parenthesis has the depth of what surrounds it).
    depth: usize,
}

fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let start = i;
        let kind = if b.is_ascii_whitespace() {
            i += 1;
            continue;
        } else if b == b'\'' || b == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b {
                i += 1;
            }
            i += 1;
            Kind::Other
        } else if b.is_ascii_alphabetic() || b == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            Kind::Word
        } else if b == b'(' {
            i += 1;
            Kind::Open
        } else if b == b')' {
            i += 1;
            Kind::Close
        } else if b == b';' {
            i += 1;
            Kind::Semicolon
        } else {
            i += 1;
            Kind::Other
        };
        let token_depth = match kind {
            Kind::Close => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("an unbalanced `)` at byte {start}"))?;
                depth
            }
            _ => depth,
        };
        if kind == Kind::Open {
            depth += 1;
        }
        out.push(Token {
            kind,
            span: start..i,
            depth: token_depth,
        });
    }
    if depth != 0 {
        return Err("unbalanced parentheses".to_owned());
    }
    Ok(out)
}

fn word(text: &str, token: &Token) -> Option<String> {
    (token.kind == Kind::Word).then(|| text[token.span.clone()].to_ascii_uppercase())
}

fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The predicates of every WHERE clause of `text` (comment-free, see [`strip_comments`]), in
/// the order they appear. `statement` names the statement in errors.
pub fn predicates(statement: &str, text: &str) -> Result<Vec<Predicate>, String> {
    let tokens = tokens(text).map_err(|e| format!("{statement}: {e}"))?;
    let mut found: Vec<Predicate> = Vec::new();
    for (at, token) in tokens.iter().enumerate() {
        if word(text, token).as_deref() != Some("WHERE") {
            continue;
        }
        let depth = token.depth;
        // The clause's tokens, then split at top-level AND.
        let mut conjuncts: Vec<Vec<&Token>> = vec![Vec::new()];
        for next in &tokens[at + 1..] {
            let upper = word(text, next);
            let at_depth = next.depth == depth;
            if next.kind == Kind::Close && next.depth < depth {
                break;
            }
            if at_depth && next.kind == Kind::Semicolon {
                break;
            }
            if at_depth && upper.as_deref().is_some_and(|w| CLAUSE_END.contains(&w)) {
                break;
            }
            if at_depth && upper.as_deref() == Some("AND") {
                conjuncts.push(Vec::new());
                continue;
            }
            if at_depth {
                if let Some(w) = upper.as_deref().filter(|w| NOT_UNDERSTOOD.contains(w)) {
                    return Err(format!(
                        "{statement}: `{w}` at the top level of a WHERE clause (byte {}): this \
                         reader only splits conjunctions; parenthesise the expression or teach \
                         tests/guards_support/parse.rs the new shape",
                        next.span.start
                    ));
                }
            }
            conjuncts.last_mut().expect("never empty").push(next);
        }
        for conjunct in conjuncts {
            let (Some(first), Some(last)) = (conjunct.first(), conjunct.last()) else {
                return Err(format!(
                    "{statement}: an empty conjunct in the WHERE clause at byte {}",
                    token.span.start
                ));
            };
            let span = first.span.start..last.span.end;
            let text = normalize(&text[span.clone()]);
            let occurrence = 1 + found.iter().filter(|p| p.text == text).count();
            found.push(Predicate {
                text,
                span,
                occurrence,
            });
        }
    }
    found.sort_by_key(|p| p.span.start);
    Ok(found)
}

/// `text` with one predicate replaced by `TRUE` (the guard removed).
pub fn without(text: &str, predicate: &Predicate) -> String {
    format!(
        "{}TRUE{}",
        &text[..predicate.span.start],
        &text[predicate.span.end..]
    )
}

/// Whether `text` (comment-free) writes rows: it has an UPDATE, DELETE or INSERT keyword.
pub fn writes(text: &str) -> Result<bool, String> {
    Ok(tokens(text)?.iter().any(|t| {
        matches!(
            word(text, t).as_deref(),
            Some("UPDATE" | "DELETE" | "INSERT")
        ) && !text[..t.span.start]
            .trim_end()
            .to_ascii_uppercase()
            .ends_with("FOR")
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(sql: &str) -> Result<Vec<String>, String> {
        let text = strip_comments(sql)?;
        Ok(predicates("t", &text)?
            .into_iter()
            .map(|p| p.text)
            .collect())
    }

    #[test]
    fn conjuncts_nested_clauses_and_parenthesised_groups() {
        let sql = "WITH c AS (SELECT id FROM t WHERE a IS NULL AND b <= now() -- x AND y\n \
                   AND (k IS NULL OR NOT EXISTS (SELECT 1 FROM t e WHERE e.id < o.id)) \
                   ORDER BY a LIMIT $1 FOR UPDATE SKIP LOCKED) \
                   UPDATE t SET s = 'x AND y' WHERE id = ANY (ARRAY(SELECT id FROM c)) RETURNING id";
        assert_eq!(
            texts(sql).unwrap(),
            [
                "a IS NULL",
                "b <= now()",
                "(k IS NULL OR NOT EXISTS (SELECT 1 FROM t e WHERE e.id < o.id))",
                "e.id < o.id",
                "id = ANY (ARRAY(SELECT id FROM c))",
            ]
        );
    }

    #[test]
    fn shapes_it_does_not_understand_are_errors() {
        for bad in [
            "UPDATE t SET a = 1 WHERE a = 1 OR b = 2",
            "DELETE FROM t WHERE a BETWEEN 1 AND 2",
            "UPDATE t SET a = 1 WHERE CASE WHEN a THEN b END",
            "UPDATE t SET a = 1 WHERE a = 1 AND AND b = 2",
            "UPDATE t SET a = 1 WHERE",
            "UPDATE t SET a = (1 WHERE a = 1",
            "UPDATE /* x */ t SET a = 1 WHERE a = 1",
        ] {
            assert!(texts(bad).is_err(), "accepted: {bad}");
        }
    }

    #[test]
    fn removing_a_predicate_replaces_exactly_its_text() {
        let text = "UPDATE t SET a = 1 WHERE id = $1 AND  lease_until > now() RETURNING id";
        let found = predicates("t", text).unwrap();
        assert_eq!(found[1].text, "lease_until > now()");
        assert_eq!(
            without(text, &found[1]),
            "UPDATE t SET a = 1 WHERE id = $1 AND  TRUE RETURNING id"
        );
        assert!(writes(text).unwrap());
        assert!(!writes("SELECT a FROM t WHERE a = 1 FOR UPDATE SKIP LOCKED").unwrap());
    }
}
