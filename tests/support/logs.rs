//! A child's log in a failure message: the last lines, so a panic stays readable.

use std::path::Path;

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The last `n` lines of the file at `path`, under a line naming it; empty if it cannot be read.
pub fn file_tail(what: &str, path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    format!("--- {what} ({}), last lines:\n{}", path.display(), tail(&text, n))
}

/// The message of the last panic in this process, kept by the hook that [`remember_panics`] sets.
static LAST_PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Keeps each panic's message (and still prints it as before), so a teardown that dumps pages of
/// logs can say the failure once more after them: CI shows only the end of a long output.
pub fn remember_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            let message = info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| info.payload().downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_default();
            if let Ok(mut last) = LAST_PANIC.lock() {
                *last = Some(format!("{message}{at}"));
            }
            previous(info);
        }));
    });
}

/// The failure once more, for the last line of a teardown's log dump.
#[allow(clippy::print_stderr)] // a failing test's own output
pub fn repeat_failure() {
    if let Some(message) = LAST_PANIC.lock().ok().and_then(|l| l.clone()) {
        eprintln!("=== the test failed (repeated after the logs above): {message}");
    }
}
