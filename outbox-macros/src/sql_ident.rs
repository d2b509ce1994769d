//! The safe SQL identifier rule for outbox table names. The runtime applies the same rule
//! (`Store::for_table`), so a table accepted here is accepted there.

/// 1 to 63 bytes (PostgreSQL's identifier limit), `[a-z_][a-z0-9_]*`: nothing that needs
/// quoting, so the name can be spliced into SQL as it is.
pub(crate) fn is_safe_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    let Some(first) = bytes.next() else {
        return false;
    };
    name.len() <= 63
        && (first.is_ascii_lowercase() || first == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::is_safe_identifier;

    #[test]
    fn accepts_plain_lowercase_names() {
        assert!(is_safe_identifier("outbox"));
        assert!(is_safe_identifier("_billing_outbox2"));
        assert!(is_safe_identifier(&"a".repeat(63)));
    }

    #[test]
    fn rejects_names_that_would_need_quoting() {
        for bad in [
            "",
            "Outbox",
            "1outbox",
            "out box",
            "outbox;drop",
            "out-box",
            "ö",
        ] {
            assert!(!is_safe_identifier(bad), "{bad:?} should be rejected");
        }
        assert!(!is_safe_identifier(&"a".repeat(64)));
    }
}
