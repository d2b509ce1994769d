//! Keeping a publisher's credentials out of failure reasons, logs and `Debug` output.
//!
//! A receiver or broker URL can carry secrets: `https://user:password@host/hook?token=...`,
//! `nats://user:password@host`; so can the headers of a request: the
//! `Authorization: Basic base64(user:password)` an HTTP client derives from such a URL, a
//! bearer token or an API key. Text a publisher does not write itself (a receiver's response
//! body, a client library's error message) may repeat them: a redirect page that shows the
//! target URL, an error that names the URL it failed on, a debugging receiver that echoes the
//! request's headers. A [`Redactor`] holds every spelling of those secrets and replaces each
//! occurrence with `[redacted]` before the text is stored or logged.
//!
//! The spellings of a secret: as written; percent-decoded and percent-encoded in the usual
//! ways; and base64-encoded (standard and URL-safe alphabet, padded or not), also where the
//! secret is only part of a longer base64-encoded text (a header dump encoded whole), where
//! its encoding depends on its offset: the characters that only the secret's bytes decide are
//! found at each of the three offsets. Secrets shorter than 3 bytes get no base64 spelling
//! (it would be 2 or 3 characters, found in any text), and base64 inside a longer text is
//! recognised from 6 bytes of the secret on.

/// What replaces a secret.
const MARK: &str = "[redacted]";
/// Passes that replace secrets with [`MARK`] before falling back to removing them (a mark can
/// itself complete a secret with its neighbours; removal shortens the text so it ends).
const MARK_PASSES: usize = 4;

/// Removes the credentials and query values of one URL from any text; see the
/// [module docs](self).
#[derive(Clone, Default)]
pub struct Redactor {
    /// Every spelling of every secret, longest first, none empty.
    variants: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The variants are the secrets: never print them.
        f.debug_struct("Redactor")
            .field("spellings", &self.variants.len())
            .finish()
    }
}

impl Redactor {
    /// A redactor for the secrets of `url`: the user and password of its userinfo (or a bare
    /// `token@`), every query value (or a bare query segment) and the fragment. `url` may be a
    /// comma-separated list of URLs (as NATS accepts).
    pub fn for_url(url: &str) -> Redactor {
        Redactor::for_secrets(url_secrets(url))
    }

    /// A redactor for a credential sent as a header's value (`Authorization`, an API key): the
    /// value as sent; the credential after an authentication scheme (`Bearer <token>`,
    /// `Basic <base64>`); for `Basic`, the decoded `user:password`, and the user and the
    /// password each. Every one in every spelling (see the [module docs](self)).
    pub fn for_header_value(value: &str) -> Redactor {
        let value = value.trim();
        let mut secrets = vec![value.to_owned()];
        if let Some((scheme, credential)) = value.split_once(' ') {
            let credential = credential.trim();
            secrets.push(credential.to_owned());
            if scheme.eq_ignore_ascii_case("basic") {
                if let Some(decoded) = base64_decode(credential) {
                    let decoded = String::from_utf8_lossy(&decoded).into_owned();
                    if let Some((user, password)) = decoded.split_once(':') {
                        secrets.push(user.to_owned());
                        secrets.push(password.to_owned());
                    }
                    secrets.push(decoded);
                }
            }
        }
        Redactor::for_secrets(secrets)
    }

    /// A redactor for the given secrets (as they appear in a URL: percent-encoded or not).
    pub fn for_secrets<I, S>(secrets: I) -> Redactor
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut variants: Vec<String> = Vec::new();
        for secret in secrets {
            variants.extend(spellings(secret.as_ref()));
        }
        variants.retain(|v| !v.is_empty());
        variants.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        variants.dedup();
        Redactor { variants }
    }

    /// Add the secrets of another redactor (a second URL).
    pub fn merge(mut self, other: &Redactor) -> Redactor {
        self.variants.extend(other.variants.iter().cloned());
        self.variants
            .sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        self.variants.dedup();
        self
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.variants.is_empty()
    }

    /// `text` with every occurrence of every spelling of every secret replaced by
    /// `[redacted]`. The result never contains a secret, even where a replacement would have
    /// joined with its neighbours into one (then the secret is removed instead).
    pub fn redact(&self, text: &str) -> String {
        if self.variants.is_empty() {
            return text.to_owned();
        }
        let mut current = text.to_owned();
        // A mark that holds a secret would only nest: remove from the start then.
        let passes = if self.variants.iter().any(|v| MARK.contains(v.as_str())) {
            0
        } else {
            MARK_PASSES
        };
        for _ in 0..passes {
            match self.replace_occurrences(&current, MARK) {
                Some(next) => current = next,
                None => return current,
            }
        }
        // Each pass removes at least one byte, so this ends.
        while let Some(next) = self.replace_occurrences(&current, "") {
            current = next;
        }
        current
    }

    /// Redact `bytes` (lossy UTF-8), then keep at most `limit` bytes of the result, cut on a
    /// character boundary, with ` [truncated]` when something was cut (or `truncated` says the
    /// input was itself cut). Redacting before cutting means a secret across the cut is
    /// replaced whole; a cut text also never ends with the beginning of a secret (a secret the
    /// input itself cut off in the middle).
    pub fn bounded(&self, bytes: &[u8], limit: usize, truncated: bool) -> String {
        let mut text = self.redact(&String::from_utf8_lossy(bytes));
        let cut = truncated || text.len() > limit;
        if text.len() > limit {
            text.truncate(floor_char_boundary(&text, limit));
        }
        if cut {
            // A multi-byte character the input cut in half shows up as U+FFFD; drop it.
            while text.ends_with('\u{FFFD}') {
                text.pop();
            }
            self.drop_trailing_secret_start(&mut text);
            text.push_str(" [truncated]");
            // The suffix could complete a secret with the text before it.
            text = self.redact(&text);
        }
        text
    }

    /// How many bytes a secret spans at most: read this much beyond a limit so that a secret
    /// across it is seen whole.
    pub fn longest(&self) -> usize {
        self.variants.first().map_or(0, String::len)
    }

    /// Remove from the end of `text` any part that begins a secret.
    fn drop_trailing_secret_start(&self, text: &mut String) {
        loop {
            let bytes = text.as_bytes();
            let found = self.variants.iter().find_map(|v| {
                let v = v.as_bytes();
                (1..v.len().min(bytes.len() + 1))
                    .rev()
                    .find(|&k| bytes.ends_with(&v[..k]))
            });
            match found {
                // The removed part starts like a secret, which starts on a character boundary.
                Some(k) => text.truncate(text.len() - k),
                None => return,
            }
        }
    }

    /// Replace every (possibly overlapping) occurrence of a spelling with `with`, merging
    /// overlapping and adjacent ones; `None` when there is none.
    fn replace_occurrences(&self, text: &str, with: &str) -> Option<String> {
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for variant in &self.variants {
            let mut from = 0;
            while let Some(at) = text[from..].find(variant.as_str()) {
                let start = from + at;
                ranges.push((start, start + variant.len()));
                // Next character, for overlapping occurrences.
                from = start + text[start..].chars().next().map_or(1, char::len_utf8);
                if from >= text.len() {
                    break;
                }
            }
        }
        if ranges.is_empty() {
            return None;
        }
        ranges.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut written = 0;
        let mut i = 0;
        while i < ranges.len() {
            let (start, mut end) = ranges[i];
            i += 1;
            while i < ranges.len() && ranges[i].0 <= end {
                end = end.max(ranges[i].1);
                i += 1;
            }
            out.push_str(&text[written..start]);
            out.push_str(with);
            written = end;
        }
        out.push_str(&text[written..]);
        Some(out)
    }
}

/// `url` shown without userinfo, query or fragment, for messages about a URL that may not even
/// parse (a comma-separated list is shown part by part).
pub fn shown_url(url: &str) -> String {
    url.split(',')
        .map(|part| {
            let part = part.trim();
            let (scheme, rest) = match part.find("://") {
                Some(i) => (&part[..i + 3], &part[i + 3..]),
                None => ("", part),
            };
            let rest = &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
            let authority_end = rest.find('/').unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            let host = authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host);
            format!("{scheme}{host}{path}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The userinfo of the first URL of `url` (a comma-separated list) that has one,
/// percent-decoded: `(user, Some(password))`, or `(token, None)` for a bare `token@`.
pub fn userinfo(url: &str) -> Option<(String, Option<String>)> {
    url.split(',').find_map(|part| {
        let part = part.trim();
        let rest = part.find("://").map_or(part, |i| &part[i + 3..]);
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        let (userinfo, _host) = authority.rsplit_once('@')?;
        Some(match userinfo.split_once(':') {
            Some((user, password)) => (percent_decode(user), Some(percent_decode(password))),
            None => (percent_decode(userinfo), None),
        })
    })
}

/// The secrets of `url` as written (possibly percent-encoded): userinfo parts, query values,
/// fragment. Parsed by hand so that a URL the `url` crate refuses is still covered.
fn url_secrets(url: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    for part in url.split(',') {
        let part = part.trim();
        let rest = part.find("://").map_or(part, |i| &part[i + 3..]);
        let (before_fragment, fragment) = match rest.split_once('#') {
            Some((before, fragment)) => (before, Some(fragment)),
            None => (rest, None),
        };
        let (before_query, query) = match before_fragment.split_once('?') {
            Some((before, query)) => (before, Some(query)),
            None => (before_fragment, None),
        };
        let authority = &before_query[..before_query.find('/').unwrap_or(before_query.len())];
        if let Some((userinfo, _host)) = authority.rsplit_once('@') {
            match userinfo.split_once(':') {
                Some((user, password)) => {
                    secrets.push(user.to_owned());
                    secrets.push(password.to_owned());
                }
                None => secrets.push(userinfo.to_owned()),
            }
        }
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.split_once('=') {
                Some((_name, value)) => secrets.push(value.to_owned()),
                None => secrets.push(pair.to_owned()),
            }
        }
        secrets.extend(fragment.map(str::to_owned));
    }
    secrets
}

/// The spellings under which a secret written in a URL can show up in other text: as written,
/// percent-decoded (with and without `+` as a space), percent-encoded again in the usual ways
/// (every byte, or all but unreserved characters; `+` for spaces; upper- and lowercase hex),
/// and base64-encoded ([`base64_spellings`]); the encodings both of the written and of the
/// decoded form.
fn spellings(written: &str) -> Vec<String> {
    let mut out = vec![
        written.to_owned(),
        hex_case(written, true),
        hex_case(written, false),
    ];
    let decoded = percent_decode(written);
    let form_decoded = percent_decode(&written.replace('+', " "));
    // A header's value is the secret as written (a `%` in it is no escape); in a URL, encoding
    // the written form again is how a URL inside another URL's query shows it.
    for plain in [written.to_owned(), decoded, form_decoded] {
        for upper in [true, false] {
            out.push(percent_encode(&plain, upper, |_| false));
            out.push(percent_encode(&plain, upper, is_unreserved));
            out.push(percent_encode(&plain, upper, is_unreserved).replace("%20", "+"));
            out.push(percent_encode(&plain, upper, |b| {
                b != b'%' && b.is_ascii_graphic()
            }));
        }
        out.extend(base64_spellings(plain.as_bytes()));
        out.push(plain);
    }
    out
}

/// Bytes from which a secret's base64 gets spellings at all (shorter ones encode to 2 or 3
/// characters, which any text holds).
const MIN_BASE64_SECRET: usize = 3;
/// Whole 3-byte groups a secret must fill at an offset for the encoding of those groups to be a
/// spelling (8 characters and up: shorter runs turn up in unrelated base64).
const MIN_BASE64_GROUPS: usize = 2;

/// The base64 spellings of `secret`: the whole secret encoded (standard and URL-safe alphabet,
/// padded and not), and, for each of the three offsets at which it can sit inside a longer
/// encoded text, the characters that only its bytes decide (the encoding of the whole 3-byte
/// groups it fills there).
fn base64_spellings(secret: &[u8]) -> Vec<String> {
    if secret.len() < MIN_BASE64_SECRET {
        return Vec::new();
    }
    let mut out = Vec::new();
    for url_safe in [false, true] {
        let whole = base64_encode(secret, url_safe);
        out.push(whole.trim_end_matches('=').to_owned());
        out.push(whole);
        // At offset 0, 1 or 2 of a group, the secret's first whole group starts at its byte 0,
        // 2 or 1.
        for skip in [0, 2, 1] {
            let groups = secret.len().saturating_sub(skip) / 3;
            if groups >= MIN_BASE64_GROUPS {
                out.push(base64_encode(&secret[skip..skip + 3 * groups], url_safe));
            }
        }
    }
    out
}

const BASE64_STANDARD: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `bytes` in base64 with padding, in the standard alphabet or the URL-safe one (`-`, `_`).
fn base64_encode(bytes: &[u8], url_safe: bool) -> String {
    let symbol = |six: u32| {
        let c = char::from(BASE64_STANDARD[(six & 63) as usize]);
        match (url_safe, c) {
            (true, '+') => '-',
            (true, '/') => '_',
            _ => c,
        }
    };
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(symbol(n >> 18));
        out.push(symbol(n >> 12));
        out.push(if chunk.len() > 1 { symbol(n >> 6) } else { '=' });
        out.push(if chunk.len() > 2 { symbol(n) } else { '=' });
    }
    out
}

/// `text` decoded from base64 (either alphabet, padding optional); `None` when it is not
/// base64.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut bits: u32 = 0;
    let mut held = 0;
    for c in text.bytes() {
        let six = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(six);
        held += 6;
        if held >= 8 {
            held -= 8;
            out.push((bits >> held) as u8);
            bits &= (1 << held) - 1;
        }
    }
    Some(out)
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// `text` with every byte for which `keep` is false written as `%XX`.
fn percent_encode(text: &str, upper: bool, keep: impl Fn(u8) -> bool) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if keep(b) {
            out.push(char::from(b));
        } else if upper {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

/// `%XX` escapes decoded (invalid ones kept as they are), as lossy UTF-8.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%' {
            if let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            ) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `text` with the hex digits of its `%XX` escapes in one case.
fn hex_case(text: &str, upper: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut escape_left = 0;
    for c in text.chars() {
        if escape_left > 0 && c.is_ascii_hexdigit() {
            escape_left -= 1;
            out.push(if upper {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            });
            continue;
        }
        escape_left = if c == '%' { 2 } else { 0 };
        out.push(c);
    }
    out
}

/// The largest character boundary of `text` at or below `at`.
fn floor_char_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
pub(crate) mod tests_support {
    //! Encoders of the tests, written apart from the module's own to check them against.

    /// Base64 the slow way, bit by bit: the tests' own encoder, to check the module's against.
    pub(crate) fn oracle_base64(bytes: &[u8]) -> String {
        let alphabet: Vec<char> = ('A'..='Z')
            .chain('a'..='z')
            .chain('0'..='9')
            .chain(['+', '/'])
            .collect();
        let bits: Vec<u8> = bytes
            .iter()
            .flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1))
            .collect();
        let mut out: String = bits
            .chunks(6)
            .map(|six| {
                let v = (0..6).fold(0usize, |v, i| {
                    (v << 1) | usize::from(*six.get(i).unwrap_or(&0))
                });
                alphabet[v]
            })
            .collect();
        while out.len() % 4 != 0 {
            out.push('=');
        }
        out
    }

    /// Every byte of `text` as `%XX` (uppercase hex).
    pub(crate) fn percent_encode_all(text: &str) -> String {
        text.bytes().map(|b| format!("%{b:02X}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::oracle_base64;
    use super::*;
    use proptest::prelude::*;

    const URL: &str = "https://alice:p%40ss+w0rd@hooks.example/in?token=T0k%2Fen&mode=x#frag";

    #[test]
    fn every_spelling_of_every_secret_is_redacted() {
        let r = Redactor::for_url(URL);
        let text = "alice p%40ss+w0rd p@ss+w0rd p@ss w0rd p%40ss%2Bw0rd T0k%2Fen T0k/en t0k%2fen T0k%2fen frag";
        let out = r.redact(text);
        for secret in [
            "alice", "p@ss", "p%40ss", "T0k/en", "T0k%2F", "T0k%2f", "frag",
        ] {
            assert!(!out.contains(secret), "{secret} in {out}");
        }
        assert!(out.contains("[redacted]"), "{out}");
        assert!(!out.contains("w0rd"), "{out}");
    }

    #[test]
    fn a_mark_that_would_complete_a_secret_is_replaced_by_nothing() {
        let r = Redactor::for_secrets(["s", "]x"]);
        let out = r.redact("sx");
        assert!(!out.contains('s') && !out.contains("]x"), "{out}");
        let r = Redactor::for_secrets(["redacted"]);
        assert_eq!(r.redact("a redacted b"), "a  b");
    }

    #[test]
    fn a_cut_never_keeps_the_start_of_a_secret() {
        let r = Redactor::for_secrets(["supersecret"]);
        // The input itself was cut inside the secret.
        assert_eq!(r.bounded(b"page: super", 100, true), "page:  [truncated]");
        // The limit falls inside the secret: it is redacted whole first.
        let out = r.bounded(b"page: supersecret tail", 9, false);
        assert_eq!(out, "page: [re [truncated]");
        assert_eq!(
            r.bounded("é".repeat(10).as_bytes(), 5, false),
            "éé [truncated]"
        );
        assert_eq!(r.bounded(b"short", 10, false), "short");
    }

    #[test]
    fn urls_are_shown_without_userinfo_or_query() {
        assert_eq!(shown_url(URL), "https://hooks.example/in");
        assert_eq!(
            shown_url("nats://u:p@h1:4222,nats://t@h2"),
            "nats://h1:4222,nats://h2"
        );
        assert_eq!(shown_url("tok@127.0.0.1:4222"), "127.0.0.1:4222");
        assert_eq!(shown_url("not a url?x=1"), "not a url");
        assert_eq!(
            userinfo("nats://h0,nats://u%40x:p%3As@h1"),
            Some(("u@x".to_owned(), Some("p:s".to_owned())))
        );
        assert_eq!(userinfo("nats://tok@h"), Some(("tok".to_owned(), None)));
        assert_eq!(userinfo("nats://h/p@q"), None);
    }

    #[test]
    fn debug_never_shows_the_secrets() {
        let shown = format!("{:?}", Redactor::for_url(URL));
        assert!(
            !shown.contains("alice") && !shown.contains("T0k"),
            "{shown}"
        );
    }

    /// The characters of `encoded` (the base64 of a text in which `secret` starts at byte
    /// `at`) that only the secret's bytes decide: those of the whole 3-byte groups inside it.
    fn oracle_core(encoded: &str, at: usize, secret_len: usize) -> &str {
        let first_group = at.div_ceil(3);
        let end_group = (at + secret_len) / 3;
        if end_group < first_group + 2 {
            return "";
        }
        &encoded[4 * first_group..4 * end_group]
    }

    #[test]
    fn base64_matches_the_bit_by_bit_encoder_and_decodes_back() {
        for len in 0..20 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 250) as u8).collect();
            let encoded = base64_encode(&bytes, false);
            assert_eq!(encoded, oracle_base64(&bytes));
            assert_eq!(base64_decode(&encoded).unwrap(), bytes);
            let url_safe = base64_encode(&bytes, true);
            assert_eq!(url_safe, encoded.replace('+', "-").replace('/', "_"));
            assert_eq!(
                base64_decode(url_safe.trim_end_matches('=')).unwrap(),
                bytes
            );
        }
        assert_eq!(base64_decode("not base64!"), None);
    }

    #[test]
    fn a_basic_credential_is_redacted_as_sent_decoded_and_in_parts() {
        let sent = format!("Basic {}", oracle_base64(b"svc-billing:pa55:w/rd"));
        let r = Redactor::for_header_value(&sent);
        let echoed = format!(
            "authorization: {sent}\nuser=svc-billing pass=pa55:w/rd both=svc-billing:pa55:w/rd enc=pa55%3Aw%2Frd"
        );
        let out = r.redact(&echoed);
        for part in ["svc-billing", "pa55", "w/rd", "w%2Frd", &sent[6..]] {
            assert!(!out.contains(part), "{part} in {out}");
        }
        assert!(out.starts_with("authorization: [redacted]"), "{out}");
        let bearer = Redactor::for_header_value("Bearer eyJhbGciOi.eyJzdWIi.c2lnbmF0dXJl");
        assert_eq!(
            bearer.redact("token eyJhbGciOi.eyJzdWIi.c2lnbmF0dXJl rejected"),
            "token [redacted] rejected"
        );
        let shown = format!("{r:?}");
        assert!(!shown.contains("svc") && !shown.contains("pa55"), "{shown}");
    }

    fn secret() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-zA-Z0-9]{1,12}",
            "[ -~]{1,12}",
            "\\PC{1,8}",
            "%[0-9a-fA-F]{2}[a-z]{0,4}",
        ]
    }

    proptest! {
        #[test]
        fn redacted_text_never_contains_a_secret(
            secrets in prop::collection::vec(secret(), 1..4),
            noise in prop::collection::vec("\\PC{0,12}", 1..6),
        ) {
            let redactor = Redactor::for_secrets(&secrets);
            let mut body = String::new();
            for (i, n) in noise.iter().enumerate() {
                body.push_str(n);
                body.push_str(&secrets[i % secrets.len()]);
            }
            let out = redactor.redact(&body);
            for s in &secrets {
                prop_assert!(!out.contains(s.as_str()), "{:?} in {:?}", s, out);
            }
        }

        #[test]
        fn encoded_secrets_in_urls_are_redacted(
            secret in "[ -~]{3,12}",
            noise in "\\PC{0,20}",
        ) {
            let written = percent_encode(&secret, true, is_unreserved);
            let url = format!("https://u:{written}@h/p?token={written}");
            let redactor = Redactor::for_url(&url);
            let body = format!("{noise}{secret}{noise}{written}{noise}{}", written.to_lowercase());
            let out = redactor.redact(&body);
            prop_assert!(!out.contains(&secret), "{:?} in {:?}", secret, out);
            prop_assert!(!out.contains(&written), "{:?} in {:?}", written, out);
        }

        /// A credential a request carried in a header (`Basic` from a URL's userinfo, a bearer
        /// token), repeated by a receiver in any of the encodings it could use: raw,
        /// percent-encoded (either hex case, every byte or all but unreserved, form-style),
        /// base64 (standard or URL-safe, padded or not), or base64-encoded as part of a longer
        /// text at any offset. The redacted text holds none of them: not the secret, not its
        /// encoding, and not the part of a longer encoding that only the secret decides.
        #[test]
        fn a_header_credential_is_redacted_in_every_encoding(
            user in "[!-9;-~]{1,10}",
            password in "\\PC{3,14}",
            token in "[A-Za-z0-9._~+/-]{8,40}",
            before in prop::collection::vec(any::<u8>(), 0..5),
            after in prop::collection::vec(any::<u8>(), 0..5),
            noise in "\\PC{0,12}",
        ) {
            let credentials = format!("{user}:{password}");
            let basic = format!("Basic {}", oracle_base64(credentials.as_bytes()));
            let bearer = format!("Bearer {token}");
            let redactor = Redactor::for_header_value(&basic).merge(&Redactor::for_header_value(&bearer));
            let mut secrets = vec![basic.clone(), bearer.clone(), credentials.clone(), password.clone(), token.clone()];
            if user.len() >= MIN_BASE64_SECRET {
                secrets.push(user.clone());
            }
            for secret in &secrets {
                let bytes = secret.as_bytes();
                let mut embedded = before.clone();
                embedded.extend_from_slice(bytes);
                embedded.extend_from_slice(&after);
                let embedded = oracle_base64(&embedded);
                let whole = oracle_base64(bytes);
                let encodings = [
                    secret.clone(),
                    percent_encode(secret, true, |_| false),
                    percent_encode(secret, false, is_unreserved),
                    percent_encode(secret, true, is_unreserved).replace("%20", "+"),
                    whole.clone(),
                    whole.trim_end_matches('=').to_owned(),
                    whole.replace('+', "-").replace('/', "_"),
                    embedded.clone(),
                ];
                for encoding in encodings {
                    let text = format!("{noise}<{encoding}>{noise}");
                    let out = redactor.redact(&text);
                    prop_assert!(!out.contains(secret.as_str()), "{:?} in {:?}", secret, out);
                    prop_assert!(!out.contains(&whole), "{:?} in {:?}", whole, out);
                    let core = oracle_core(&embedded, before.len(), bytes.len());
                    prop_assert!(
                        core.is_empty() || !out.contains(core),
                        "{:?} (base64 of {:?} at offset {}) in {:?}", core, secret, before.len(), out
                    );
                }
            }
        }

        #[test]
        fn bounded_text_never_contains_a_secret_or_its_start_at_the_cut(
            secrets in prop::collection::vec(secret(), 1..3),
            noise in prop::collection::vec("\\PC{0,12}", 1..6),
            limit in 0usize..80,
            truncated in any::<bool>(),
        ) {
            let redactor = Redactor::for_secrets(&secrets);
            let mut body = String::new();
            for (i, n) in noise.iter().enumerate() {
                body.push_str(n);
                body.push_str(&secrets[i % secrets.len()]);
            }
            let out = redactor.bounded(body.as_bytes(), limit, truncated);
            for s in &secrets {
                prop_assert!(!out.contains(s.as_str()), "{:?} in {:?}", s, out);
            }
        }
    }
}
