//! Unified hunks as `git diff` prints them with its defaults: Myers line diff, sliders placed by
//! the indent heuristic, 3 lines of context, changes at most 6 unchanged lines apart in one
//! hunk, and the function line after `@@` found by git's default rule ([`func_name`]).

use std::ops::Range;

use imara_diff::{Algorithm, Diff, InternedInput};

/// Lines of context around a change.
const CONTEXT: usize = 3;

/// The longest function line git keeps after `@@` (its buffer), before trimming.
const FUNC_MAX: usize = 80;

/// git's hunk header buffer: a function line is cut so that the header fits in it.
const HEADER_MAX: usize = 128;

/// One change: lines `old` of the old text replaced by lines `new` of the new one.
struct Change {
    old: Range<usize>,
    new: Range<usize>,
}

/// The lines of `data`, each with its newline (the last may lack one).
fn lines(data: &[u8]) -> Vec<&[u8]> {
    data.split_inclusive(|&b| b == b'\n').collect()
}

/// git's default function line rule: a line starting with an ASCII letter, `_` or `$`, cut to
/// [`FUNC_MAX`] bytes and stripped of trailing whitespace. Nothing for any other line.
pub fn func_name(line: &[u8]) -> Option<&[u8]> {
    let first = *line.first()?;
    if !(first.is_ascii_alphabetic() || first == b'_' || first == b'$') {
        return None;
    }
    let mut cut = &line[..line.len().min(FUNC_MAX)];
    // C's isspace: space, \t, \n, \v, \f, \r.
    while let Some((&last, rest)) = cut.split_last() {
        if !(last == b' ' || (b'\t'..=b'\r').contains(&last)) {
            break;
        }
        cut = rest;
    }
    Some(cut)
}

/// The changes git finds between the lines of `old` and `new`.
fn changes(old: &[u8], new: &[u8]) -> Vec<Change> {
    let input = InternedInput::new(old, new);
    let mut diff = Diff::compute(Algorithm::Myers, &input);
    diff.postprocess_lines(&input);
    diff.hunks()
        .map(|h| Change {
            old: h.before.start as usize..h.before.end as usize,
            new: h.after.start as usize..h.after.end as usize,
        })
        .collect()
}

/// One line with its one-character prefix, and git's marker when it lacks a newline.
fn record(prefix: u8, line: &[u8], out: &mut Vec<u8>) {
    out.push(prefix);
    out.extend_from_slice(line);
    if line.last() != Some(&b'\n') {
        out.extend_from_slice(b"\n\\ No newline at end of file\n");
    }
}

/// One side of a hunk header: the first line (one-based; the line before for an empty range)
/// and the count, which is left out when it is 1.
fn range(out: &mut Vec<u8>, sign: char, start: usize, count: usize) {
    let first = if count == 0 { start } else { start + 1 };
    out.extend_from_slice(format!("{sign}{first}").as_bytes());
    if count != 1 {
        out.extend_from_slice(format!(",{count}").as_bytes());
    }
}

/// Append the hunks turning text `old` into `new` (both split at `\n`) to `out`.
pub fn unified(old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    let a = lines(old);
    let b = lines(new);
    let all = changes(old, new);
    // The function line of the last hunk, kept until an earlier line of a later hunk has one.
    let mut func: &[u8] = &[];
    let mut searched_to: isize = -1;
    let mut first = 0;
    while first < all.len() {
        let mut last = first;
        while last + 1 < all.len() && all[last + 1].old.start - all[last].old.end <= 2 * CONTEXT {
            last += 1;
        }
        let (head, tail) = (&all[first], &all[last]);
        let s1 = head.old.start.saturating_sub(CONTEXT);
        let s2 = head.new.start.saturating_sub(CONTEXT);
        let after = CONTEXT
            .min(a.len() - tail.old.end)
            .min(b.len() - tail.new.end);
        let (e1, e2) = (tail.old.end + after, tail.new.end + after);

        let mut l = s1 as isize - 1;
        while l > searched_to {
            if let Some(f) = func_name(a[l as usize]) {
                func = f;
                break;
            }
            l -= 1;
        }
        searched_to = s1 as isize - 1;

        let header_start = out.len();
        out.extend_from_slice(b"@@ ");
        range(out, '-', s1, e1 - s1);
        out.push(b' ');
        range(out, '+', s2, e2 - s2);
        out.extend_from_slice(b" @@");
        if !func.is_empty() {
            out.push(b' ');
            let room = HEADER_MAX - 1 - (out.len() - header_start);
            out.extend_from_slice(&func[..func.len().min(room)]);
        }
        out.push(b'\n');

        let mut at = s2;
        for c in &all[first..=last] {
            for line in &b[at..c.new.start] {
                record(b' ', line, out);
            }
            for line in &a[c.old.clone()] {
                record(b'-', line, out);
            }
            for line in &b[c.new.clone()] {
                record(b'+', line, out);
            }
            at = c.new.end;
        }
        for line in &b[at..e2] {
            record(b' ', line, out);
        }
        first = last + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_lines_follow_git() {
        assert_eq!(func_name(b"int main(void)\n"), Some(&b"int main(void)"[..]));
        assert_eq!(func_name(b"_x \t\r\n"), Some(&b"_x"[..]));
        assert_eq!(func_name(b"$v"), Some(&b"$v"[..]));
        assert_eq!(func_name(b"    indented\n"), None);
        assert_eq!(func_name(b"{\n"), None);
        assert_eq!(func_name("\u{e9}t\u{e9}\n".as_bytes()), None);
        let long = [b'f'; 100];
        assert_eq!(func_name(&long).map(<[u8]>::len), Some(FUNC_MAX));
    }

    #[test]
    fn hunk_headers_and_missing_newlines() {
        let mut out = Vec::new();
        unified(b"a\nb\nc", b"a\nb\nd", &mut out);
        assert_eq!(
            out,
            b"@@ -1,3 +1,3 @@\n a\n b\n-c\n\\ No newline at end of file\n+d\n\\ No newline at end of file\n"
        );
        out.clear();
        unified(b"", b"x\n", &mut out);
        assert_eq!(out, b"@@ -0,0 +1 @@\n+x\n");
    }
}
