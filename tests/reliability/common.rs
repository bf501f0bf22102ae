//! What the reliability tests share beyond tests/support: the figures each test prints for
//! `hack/reliability.sh`, and the sizes of the H100 profiles they place.

/// One line `hack/reliability.sh` turns into a row of the figures table.
pub fn figure(section: &str, name: &str, value: impl std::fmt::Display) {
    println!("FIGURE\t{section}\t{name}\t{value}");
}

/// Memory slices `[start, start + size)` of an H100 80GB profile, by profile ID.
pub fn h100_size(profile_id: u64) -> u64 {
    match profile_id {
        19 => 1,
        15 | 14 => 2,
        9 | 5 => 4,
        0 => 8,
        other => panic!("profile {other} not used here"),
    }
}
