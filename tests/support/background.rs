//! Builds `.ci/run` starts in the background while the tests run (the real slurm-bridge, the
//! image): the tests that need one wait here for its log's last `exit STATUS` line.

use std::path::Path;
use std::time::{Duration, Instant};

/// Wait until the background build writing `log` ends (`.ci/run` appends `exit STATUS` to its log
/// then). `what` names the build for the messages, `script` the command that failed. Panics with
/// the log when the build failed, or after 45 minutes.
#[allow(clippy::print_stdout)] // says what it waits for
pub fn wait_for(log: &Path, what: &str, script: &str) {
    let start = Instant::now();
    let mut said = false;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        match text.lines().rev().find_map(|l| l.strip_prefix("exit ")) {
            Some("0") => {
                if said {
                    println!("{what} done after {:.0?} of waiting", start.elapsed());
                }
                return;
            }
            Some(status) => panic!("{script} failed ({status}):\n{text}"),
            None => {}
        }
        assert!(start.elapsed() < Duration::from_secs(45 * 60), "{script} still runs after 45 minutes:\n{text}");
        if !said {
            println!("waiting for {what} in the background ({})", log.display());
            said = true;
        }
        std::thread::sleep(Duration::from_secs(5));
    }
}
