//! `migdra demo` is README's first command: it must run the real daemon end to end and tell the
//! story it promises.

use crate::support::command::{Run, migdra};

#[test]
fn the_demo_runs_the_daemon_through_a_day_and_leaves_nothing_behind() {
    let out = migdra().args(["demo", "--fast"]).run();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("kubelet: registered mig.slinky.slurm.net (DRAPlugin)"), "{text}");
    assert!(text.contains("v1.DRAPlugin, v1beta1.DRAPlugin"));
    assert!(text.contains("no 7g.80gb fits anywhere now; erin waits"), "the large claim waits");
    assert!(text.contains("mig-7g80gb-0-0"), "and gets a GPU once one empties");
    assert!(text.contains("whole GPU: frank"), "a whole GPU with MIG off");
    assert!(text.contains("Slurm GPU index"));
    assert!(text.contains("MIG-"));
    assert!(text.contains("node is empty again: 0 MIG instances left"));
    assert!(text.contains("exited with exit status: 0"));
}
