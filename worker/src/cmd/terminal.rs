//! The one way the CLI shows text it did not write itself on a terminal.
//!
//! Job output, and everything read from Redis (ids, queue and consumer names, dead letters'
//! reasons, which quote a job's own field names, errors), may carry escape sequences: an OSC 52
//! clipboard write, a screen clear, a title change. Printed to a terminal they would be obeyed.
//! Every such print goes through [`visible`] when its stream is a terminal ([`for_stdout`],
//! [`for_stderr`]); pipes and files get the exact text. JSON to a terminal goes through it too:
//! serde escapes C0 controls but not C1 ones or the bidirectional overrides, and what
//! [`visible`] writes in their place is printable, so the JSON stays well-formed.

use std::borrow::Cow;
use std::io::IsTerminal;

/// `text` made safe for standard output: [`visible`] when it is a terminal, else unchanged.
pub fn for_stdout(text: &str) -> Cow<'_, str> {
    if std::io::stdout().is_terminal() {
        visible(text)
    } else {
        Cow::Borrowed(text)
    }
}

/// `text` made safe for standard error: [`visible`] when it is a terminal, else unchanged.
pub fn for_stderr(text: &str) -> Cow<'_, str> {
    if std::io::stderr().is_terminal() {
        visible(text)
    } else {
        Cow::Borrowed(text)
    }
}

/// `text` with every character that a terminal would obey rather than show made visible, as
/// `cat -v` does: C0 controls but newline and tab as `^@`..`^_` (ESC as `^[`), DEL as `^?`, C1
/// controls (8-bit CSI and the like) as `M-^@`..`M-^_`; and the bidirectional overrides and
/// isolates, which reorder what is shown, as `<U+202E>`.
pub fn visible(text: &str) -> Cow<'_, str> {
    let shown = |c: char| {
        !c.is_control() && !matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
            || c == '\n'
            || c == '\t'
    };
    if text.chars().all(shown) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c as u32 {
            _ if shown(c) => out.push(c),
            code @ 0..=0x1f => {
                out.push('^');
                out.push(char::from(code as u8 + 0x40));
            }
            0x7f => out.push_str("^?"),
            code @ 0x80..=0x9f => {
                out.push_str("M-^");
                out.push(char::from((code - 0x80) as u8 + 0x40));
            }
            code => out.push_str(&format!("<U+{code:04X}>")),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_not_obeyed() {
        assert!(matches!(
            visible("plain text\n\ttabbed ünïcödé"),
            Cow::Borrowed(_)
        ));
        assert_eq!(visible("\x1b[2J\x1b]0;title\x07"), "^[[2J^[]0;title^G");
        assert_eq!(visible("a\rb\x08c\0d\x7f"), "a^Mb^Hc^@d^?");
        assert_eq!(visible("\u{9b}31m\u{9d}x\u{85}"), "M-^[31mM-^]xM-^E");
        assert_eq!(
            visible("evil\u{202e}txt.exe\u{2066}"),
            "evil<U+202E>txt.exe<U+2066>"
        );
        assert_eq!(visible("line\n"), "line\n");
    }
}
