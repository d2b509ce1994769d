//! The event name rule (also used for aggregate types). The runtime applies the same rule
//! (`outbox_runtime::contract::validate_event_name`) where names enter without the derive, so a
//! name accepted here is accepted there.
//!
//! Why this set: a name is stored in `event_type`, written into generated migrations and the
//! contract lock, logged, and mapped to a NATS subject token by token (`order.confirmed` ->
//! `outbox.order.confirmed`). Dot-separated parts of `[a-z0-9_-]` need no quoting or escaping in
//! any of these, and map to subject tokens unchanged.

/// The longest name accepted, in bytes (all characters are ASCII).
pub(crate) const MAX_LEN: usize = 128;

/// The rule in words, for error messages.
pub(crate) const RULE: &str = "1 to 128 characters: lowercase ASCII letters, digits, `_` and `-`, in parts \
                               separated by single dots, each part starting with a letter or digit \
                               (for example `order.confirmed`)";

/// What is wrong with `name`, or `None` when it follows the rule.
pub(crate) fn problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("it is empty".to_owned());
    }
    if let Some(c) = name.chars().find(|c| !is_name_char(*c)) {
        return Some(format!("it contains {}", describe(c)));
    }
    if name.len() > MAX_LEN {
        return Some(format!("it is {} characters long", name.len()));
    }
    if name.split('.').any(str::is_empty) {
        return Some("it has an empty part (a leading, trailing or doubled `.`)".to_owned());
    }
    if let Some(part) = name.split('.').find(|part| part.starts_with(['_', '-'])) {
        return Some(format!(
            "its part `{part}` does not start with a letter or digit"
        ));
    }
    None
}

/// `name` for a message: escaped (a line break shows as `\n`) and cut after 60 characters, so
/// neither a hostile nor a huge name can shape the message.
pub(crate) fn shown(name: &str) -> String {
    let escaped: String = name.escape_debug().collect();
    match escaped.char_indices().nth(60) {
        Some((cut, _)) => format!("{}...", &escaped[..cut]),
        None => escaped,
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.')
}

/// A character for a message: printable ones as themselves, the rest by code point, so a line
/// break in a name cannot break the message.
fn describe(c: char) -> String {
    if c.is_ascii_uppercase() {
        format!("the uppercase letter `{c}`")
    } else if c.is_control() || c.is_whitespace() || !c.is_ascii() {
        format!("the character U+{:04X}", u32::from(c))
    } else {
        format!("`{c}`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_names_in_use() {
        for name in [
            "order.confirmed",
            "cart.checked_out",
            "test.order_shipped",
            "invoice_paid",
            "http_request_sent",
            "v2.order-placed",
            "a",
            &"a".repeat(MAX_LEN),
        ] {
            assert_eq!(problem(name), None, "{name}");
        }
    }

    #[test]
    fn names_what_is_wrong() {
        let cases = [
            ("", "it is empty"),
            (
                "x\nDROP TABLE victim; --",
                "it contains the character U+000A",
            ),
            ("Order", "it contains the uppercase letter `O`"),
            ("order confirmed", "it contains the character U+0020"),
            ("order'", "it contains `'`"),
            ("a*/b", "it contains `*`"),
            ("a\u{2028}b", "it contains the character U+2028"),
            ("a\0", "it contains the character U+0000"),
            ("order..confirmed", "it has an empty part"),
            (".order", "it has an empty part"),
            ("order.", "it has an empty part"),
            ("order._x", "its part `_x` does not start"),
            ("-order", "its part `-order` does not start"),
        ];
        for (name, expected) in cases {
            let found = problem(name).unwrap_or_default();
            assert!(found.starts_with(expected), "{name:?}: {found}");
        }
        assert_eq!(
            problem(&"a".repeat(MAX_LEN + 1)).as_deref(),
            Some("it is 129 characters long")
        );
    }
}
