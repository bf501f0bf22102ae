//! Slurm's bracket ranges: `/dev/nvidia[0-3,5]`, `node[01-04]`, `a[1-2]b[3-4]`. Used for gres.conf
//! `File=` and for `NodeName=` selectors; also `a,b` lists at the top level (`File=x,y`).

/// The most names one expression may produce; a typo like `[0-99999999]` must not eat memory.
pub const MAX_NAMES: usize = 65_536;

/// Expand a comma-separated list of names with bracket ranges into plain names, in order.
///
/// # Errors
/// Unbalanced brackets, a range that is not `low-high` with `low <= high`, non-digits in a range,
/// an empty item, or more than [`MAX_NAMES`] names. The message names the bad part.
pub fn expand(expr: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in split_top(expr)? {
        if item.is_empty() {
            return Err(format!("{expr:?} has an empty item"));
        }
        let mut names = vec![String::new()];
        let mut rest = item;
        while let Some(open) = rest.find('[') {
            let close = rest[open..].find(']').map(|c| open + c).ok_or_else(|| format!("{item:?}: '[' without ']'"))?;
            let prefix = &rest[..open];
            let choices = ranges(&rest[open + 1..close]).map_err(|e| format!("{item:?}: {e}"))?;
            if names.len().saturating_mul(choices.len()) > MAX_NAMES {
                return Err(format!("{item:?} expands to more than {MAX_NAMES} names"));
            }
            names = names.iter().flat_map(|n| choices.iter().map(move |c| format!("{n}{prefix}{c}"))).collect();
            rest = &rest[close + 1..];
        }
        if rest.contains(']') {
            return Err(format!("{item:?}: ']' without '['"));
        }
        out.extend(names.into_iter().map(|n| n + rest));
        if out.len() > MAX_NAMES {
            return Err(format!("{expr:?} expands to more than {MAX_NAMES} names"));
        }
    }
    Ok(out)
}

/// Split at commas outside brackets.
fn split_top(expr: &str) -> Result<Vec<&str>, String> {
    let (mut depth, mut start, mut items) = (0i32, 0, Vec::new());
    for (i, c) in expr.char_indices() {
        match c {
            '[' if depth > 0 => return Err(format!("{expr:?}: nested '['")),
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(expr[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        if depth < 0 {
            return Err(format!("{expr:?}: ']' without '['"));
        }
    }
    if depth != 0 {
        return Err(format!("{expr:?}: '[' without ']'"));
    }
    items.push(expr[start..].trim());
    Ok(items)
}

/// `0-3,5,10-11` → the numbers as text, keeping the low bound's zero padding (`01-03`).
fn ranges(spec: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in spec.split(',') {
        let part = part.trim();
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let num = |s: &str| {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("range {part:?} is not N or N-M with digits"));
            }
            s.parse::<u64>().map_err(|_| format!("range {part:?} is too large"))
        };
        let (l, h) = (num(lo)?, num(hi)?);
        if l > h {
            return Err(format!("range {part:?} runs backwards"));
        }
        if h - l >= MAX_NAMES as u64 {
            return Err(format!("range {part:?} has more than {MAX_NAMES} numbers"));
        }
        let width = if lo.len() > 1 && lo.starts_with('0') { lo.len() } else { 0 };
        out.extend((l..=h).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

/// Whether `name` is one of the names `expr` expands to. A bad expression matches nothing.
pub fn contains(expr: &str, name: &str) -> Result<bool, String> {
    Ok(expand(expr)?.iter().any(|n| n == name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_ranges_lists_and_padding() {
        assert_eq!(
            expand("/dev/nvidia[0-3]").unwrap(),
            ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"]
        );
        assert_eq!(
            expand("/dev/nvidia[0,2,10-11]").unwrap(),
            ["/dev/nvidia0", "/dev/nvidia2", "/dev/nvidia10", "/dev/nvidia11"]
        );
        assert_eq!(expand("node[08-10]").unwrap(), ["node08", "node09", "node10"]);
        assert_eq!(expand("a[1-2]b[3-4]").unwrap(), ["a1b3", "a1b4", "a2b3", "a2b4"]);
        assert_eq!(expand("/dev/nvidia0,/dev/nvidia[4-5]").unwrap(), ["/dev/nvidia0", "/dev/nvidia4", "/dev/nvidia5"]);
        assert_eq!(expand("vm").unwrap(), ["vm"]);
        assert!(contains("gpu[1-3],vm", "vm").unwrap());
        assert!(!contains("gpu[1-3]", "gpu4").unwrap());
    }

    #[test]
    fn bad_ranges_say_what_is_wrong() {
        for (bad, why) in [
            ("/dev/nvidia[0-3", "'[' without ']'"),
            ("/dev/nvidia0-3]", "']' without '['"),
            ("/dev/nvidia[3-1]", "runs backwards"),
            ("/dev/nvidia[a-b]", "with digits"),
            ("/dev/nvidia[]", "with digits"),
            ("/dev/nvidia[0-99999999]", "more than"),
            ("a,,b", "empty item"),
            ("x[[1]]", "nested"),
        ] {
            let e = expand(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
