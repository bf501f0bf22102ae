//! Every link and citation in the docs and the code resolves inside this repository.
//!
//! A reader who meets `docs/facts/mig-nvml.md §1.4` in a comment, or a `[link](path#anchor)` in a
//! markdown file, must find it here. Pure: it reads files, starts nothing. It checks:
//!
//! - (a) every relative markdown link resolves to a file or directory of the repository, and its
//!   `#anchor` to a heading of the target (GitHub's slugs);
//! - (b) every `docs/...` path named in the code or the docs exists, and every file of the
//!   repository a markdown file names by its path (`src/…`, `tests/…`, `hack/…` with an
//!   extension), so a rename cannot leave the docs pointing at nothing;
//! - (c) every `docs/facts/<file>.md §N[.M]` citation names a heading of that file that starts
//!   with that number (a bare `§N` right after such a citation, or inside a facts file, counts as
//!   the same file);
//! - (d) nothing cites what is not in the repository: the design and style notes and the research
//!   notes that lived outside it, a section with no file, or a numbered issue of this project
//!   (upstream issues name their repository, like `kubernetes/kubernetes#140802`);
//! - (e) every Kubernetes or Slurm release the docs name is one CI tests (`src/cli/tested.rs`),
//!   and that list is the one `hack/` pins.
//!
//! All failures are listed at once, each as `file:line: what`. This file is not scanned: its
//! patterns would match themselves.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Directories never scanned: vendored upstream code, build output, version control.
const SKIP_DIRS: &[&str] = &["vendor", "target", ".git", "node_modules"];

/// Source files worth scanning, by extension; generated files (go.sum, Cargo.lock) are left out.
const SOURCE_EXTS: &[&str] = &["rs", "sh", "go", "proto", "toml", "yaml", "yml", "json"];

/// The markdown files and the source files to check, relative to the repository root.
fn files() -> (Vec<PathBuf>, Vec<PathBuf>) {
    let root = root();
    let mut markdown = Vec::new();
    let mut sources = Vec::new();
    for top in ["README.md", "Cargo.toml", "build.rs", ".ci/run"] {
        if root.join(top).is_file() {
            let p = PathBuf::from(top);
            if top.ends_with(".md") { markdown.push(p) } else { sources.push(p) }
        }
    }
    for dir in ["docs", "daemonset", "src", "tests", "benches", "hack", "proto"] {
        walk(&root, Path::new(dir), &mut |rel| {
            let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let ext = rel.extension().and_then(|e| e.to_str()).unwrap_or_default();
            if rel == Path::new("tests/library/docs.rs") {
                return;
            }
            if ext == "md" {
                markdown.push(rel.to_path_buf());
            } else if SOURCE_EXTS.contains(&ext) || name == "Dockerfile" {
                sources.push(rel.to_path_buf());
            }
        });
    }
    markdown.sort();
    sources.sort();
    (markdown, sources)
}

fn walk(root: &Path, rel: &Path, f: &mut dyn FnMut(&Path)) {
    let Ok(entries) = fs::read_dir(root.join(rel)) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let child = rel.join(&name);
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            if !SKIP_DIRS.contains(&name.to_str().unwrap_or_default()) {
                walk(root, &child, f);
            }
        } else if kind.is_file() {
            f(&child);
        }
    }
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped, each
/// space a `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The headings of a markdown file (outside code fences), as written after the `#`s.
fn headings(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        let hashes = t.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && t[hashes..].starts_with(' ') {
            out.push(t[hashes..].trim().to_string());
        }
    }
    out
}

/// The anchors of a markdown file, with GitHub's `-1`, `-2` … for repeated headings.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for h in headings(text) {
        let s = slug(&h);
        let n = seen.entry(s.clone()).or_insert(0);
        out.insert(if *n == 0 { s.clone() } else { format!("{s}-{n}") });
        *n += 1;
    }
    out
}

/// Whether a heading is section `number` ("1.4" matches "1.4 H100 …", "1" matches "1. GPU …"
/// but not "1.4 …" or "10. …").
fn heading_is_section(heading: &str, number: &str) -> bool {
    let Some(rest) = heading.strip_prefix(number) else { return false };
    let mut chars = rest.chars();
    match chars.next() {
        None => true,
        Some(c) if c.is_ascii_digit() => false,
        Some('.') => !chars.next().is_some_and(|c| c.is_ascii_digit()),
        Some(_) => true,
    }
}

/// `a/./b/../c` → `a/c`, without touching the file system; `None` when it climbs out of the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            _ => return None,
        }
    }
    Some(out)
}

/// Inline code spans blanked out (same length), so a `[x](y)` shown as code is not a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '-' | '_')
}

/// A section number (`1`, `1.4`, `2.1.3`) at the start of `s`, after optional spaces.
fn section_number(s: &str) -> Option<(String, usize)> {
    let skip = s.len() - s.trim_start().len();
    let t = &s[skip..];
    let mut end = 0;
    for (i, c) in t.char_indices() {
        if c.is_ascii_digit() || (c == '.' && t[i + 1..].starts_with(|d: char| d.is_ascii_digit())) {
            end = i + c.len_utf8();
        } else {
            break;
        }
    }
    (end > 0).then(|| (t[..end].to_string(), skip + end))
}

/// The checker: the files read so far and the failures found.
struct Check {
    root: PathBuf,
    texts: HashMap<PathBuf, Option<String>>,
    failures: Vec<String>,
}

impl Check {
    fn text(&mut self, rel: &Path) -> Option<String> {
        let root = self.root.clone();
        self.texts.entry(rel.to_path_buf()).or_insert_with(|| fs::read_to_string(root.join(rel)).ok()).clone()
    }

    fn fail(&mut self, file: &Path, line: usize, what: String) {
        self.failures.push(format!("{}:{line}: {what}", file.display()));
    }

    /// (a): every relative link of a markdown file, and its anchor.
    fn links(&mut self, file: &Path, text: &str) {
        let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
        let mut fence = false;
        for (n, raw) in text.lines().enumerate() {
            let t = raw.trim_start();
            if t.starts_with("```") || t.starts_with("~~~") {
                fence = !fence;
                continue;
            }
            if fence {
                continue;
            }
            let line = without_code_spans(raw);
            let mut rest = line.as_str();
            while let Some(i) = rest.find("](") {
                let after = &rest[i + 2..];
                let Some(close) = after.find(')') else { break };
                let target = after[..close].split_whitespace().next().unwrap_or_default().to_string();
                rest = &after[close..];
                self.link(file, &dir, n + 1, &target);
            }
        }
    }

    fn link(&mut self, file: &Path, dir: &Path, line: usize, target: &str) {
        if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
            return;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target, None),
        };
        let rel = if path.is_empty() { Some(file.to_path_buf()) } else { normalize(&dir.join(path)) };
        let Some(rel) = rel else {
            return self.fail(file, line, format!("link leaves the repository: ({target})"));
        };
        let abs = self.root.join(&rel);
        if !abs.exists() {
            return self.fail(file, line, format!("link to a missing file: ({target})"));
        }
        let Some(anchor) = anchor else { return };
        if abs.is_dir() || rel.extension().is_none_or(|e| e != "md") {
            return self.fail(file, line, format!("anchor on something that is not a markdown file: ({target})"));
        }
        let text = self.text(&rel).unwrap_or_default();
        if !anchors(&text).contains(anchor) {
            self.fail(file, line, format!("no heading `#{anchor}` in {}: ({target})", rel.display()));
        }
    }

    /// (b), (c) and (d) on every line of a file, markdown or source.
    /// (b) for markdown and source: files and directories (written with their slash) named by
    /// their repository path. The facts name upstream
    /// projects' files (`src/plugins/…` of Slurm), so they are left out.
    fn repo_paths(&mut self, file: &Path, text: &str) {
        if file.starts_with("docs/facts") {
            return;
        }
        const ROOTS: [&str; 6] = ["src/", "tests/", "hack/", "benches/", "daemonset/", "proto/"];
        for (n, line) in text.lines().enumerate() {
            for root in ROOTS {
                for (start, _) in line.match_indices(root) {
                    if line[..start].chars().next_back().is_some_and(is_path_char) {
                        continue;
                    }
                    let len = line[start..].find(|c: char| !is_path_char(c)).unwrap_or(line.len() - start);
                    let path = line[start..start + len].trim_end_matches(['.', ',']);
                    let named_file = Path::new(path).extension().is_some_and(|e| e.len() <= 5);
                    if named_file && !self.root.join(path).exists() {
                        self.fail(file, n + 1, format!("names a file that does not exist: {path}"));
                    }
                    // A directory written with its slash (`hack/kubelet-1.36/`): a rename leaves these.
                    let named_dir = path.ends_with('/') && path.len() > root.len();
                    if named_dir && !self.root.join(path).is_dir() {
                        self.fail(file, n + 1, format!("names a directory that does not exist: {path}"));
                    }
                }
            }
        }
    }

    fn citations(&mut self, file: &Path, text: &str, markdown: bool) {
        let own_facts = file.starts_with("docs/facts") && markdown;
        // The facts file the last citation named, and on which line: a bare `§N` within the next
        // few lines continues it ("… mig-nvml.md §1.2 … placements as §1.1").
        let mut last_cited: Option<(PathBuf, usize)> = None;
        for (n, line) in text.lines().enumerate() {
            let line_no = n + 1;
            let mut consumed: Vec<usize> = Vec::new();

            // (b) and (c): `docs/...` paths, and the sections after a facts file.
            for (start, _) in line.match_indices("docs/") {
                if line[..start].chars().next_back().is_some_and(is_path_char) {
                    continue;
                }
                let len = line[start..].find(|c: char| !is_path_char(c)).unwrap_or(line.len() - start);
                let path = line[start..start + len].trim_end_matches(['.', ',']);
                let rel = PathBuf::from(path);
                if !self.root.join(&rel).exists() {
                    self.fail(file, line_no, format!("names a path that does not exist: {path}"));
                    continue;
                }
                if rel.starts_with("docs/facts") && path.ends_with(".md") {
                    last_cited = Some((rel.clone(), line_no));
                    let mut at = start + path.len();
                    at += line[at..].len() - line[at..].trim_start_matches(['`', ' ']).len();
                    self.section_list(file, line_no, line, at, &rel, &mut consumed);
                }
            }

            // Bare `§N`: in a facts file its own section; right after a citation, that file's;
            // after `RFC NNNN` someone else's; otherwise it names no file.
            for (i, _) in line.match_indices('§') {
                if consumed.contains(&i) {
                    continue;
                }
                let Some((number, _)) = section_number(&line[i + '§'.len_utf8()..]) else { continue };
                let before = line[..i].trim_end();
                let rfc = before.rsplit_once(' ').map_or(before, |(_, w)| w).chars().all(|c| c.is_ascii_digit())
                    && before.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end().ends_with("RFC");
                if rfc {
                    continue;
                }
                // "facts §N" and "facts `x.md` §N" are reported once, as leftovers.
                let lower_before = before.to_lowercase();
                if lower_before.ends_with("facts") || lower_before.ends_with(".md`") || lower_before.ends_with(".md") {
                    continue;
                }
                let target = if own_facts {
                    Some(file.to_path_buf())
                } else {
                    last_cited.as_ref().filter(|(_, l)| line_no - l <= 3).map(|(p, _)| p.clone())
                };
                match target {
                    Some(t) => self.section(file, line_no, &t, &number),
                    None => self.fail(
                        file,
                        line_no,
                        format!("`§{number}` names no file: write `docs/facts/<file>.md §{number}`"),
                    ),
                }
            }

            self.leftovers(file, line_no, line, markdown);
        }
    }

    /// The `§N`, `§N, §M` or `§N and §M` after a cited facts file.
    fn section_list(
        &mut self,
        file: &Path,
        line_no: usize,
        line: &str,
        mut at: usize,
        facts: &Path,
        consumed: &mut Vec<usize>,
    ) {
        loop {
            if !line[at..].starts_with('§') {
                return;
            }
            consumed.push(at);
            at += '§'.len_utf8();
            let Some((number, len)) = section_number(&line[at..]) else { return };
            self.section(file, line_no, facts, &number);
            at += len;
            let rest = &line[at..];
            let sep = if let Some(r) = rest.strip_prefix(',') {
                r
            } else if let Some(r) = rest.trim_start().strip_prefix("and ") {
                r
            } else {
                return;
            };
            at = line.len() - sep.trim_start().len();
        }
    }

    fn section(&mut self, file: &Path, line_no: usize, facts: &Path, number: &str) {
        let text = self.text(facts).unwrap_or_default();
        if !headings(&text).iter().any(|h| heading_is_section(h, number)) {
            self.fail(file, line_no, format!("no section {number} in {}", facts.display()));
        }
    }

    /// (d): citations of things outside the repository.
    fn leftovers(&mut self, file: &Path, line_no: usize, line: &str, markdown: bool) {
        let lower = line.to_lowercase();
        for bad in ["shared/facts", "facts §", "facts section"] {
            if lower.contains(bad) {
                self.fail(
                    file,
                    line_no,
                    format!("cites `{bad}`, which is not in the repository: use docs/facts/<file>.md §N"),
                );
            }
        }
        for doc in ["DESIGN.md", "STYLE.md"] {
            for (i, _) in line.match_indices(doc) {
                if !line[..i].chars().next_back().is_some_and(is_path_char) {
                    self.fail(
                        file,
                        line_no,
                        format!("cites {doc}, which is not in the repository: use docs/design.md"),
                    );
                }
            }
        }
        // "facts `mig-nvml.md`" and "facts/x.md" without docs/ in front.
        for (i, _) in lower.match_indices("facts") {
            let prev = lower[..i].chars().next_back();
            let rest = &lower[i + "facts".len()..];
            let named = rest.trim_start_matches([' ', '`']);
            let file_like = named.split(|c: char| !is_path_char(c)).next().unwrap_or_default();
            if rest.starts_with([' ', '`']) && file_like.ends_with(".md") && prev != Some('/') {
                self.fail(file, line_no, format!("cites `facts {file_like}`: write docs/facts/{file_like}"));
            }
            if rest.starts_with('/') && !lower[..i].ends_with("docs/") && !prev.is_some_and(is_path_char) {
                let path = format!("facts{}", rest.split(|c: char| !is_path_char(c)).next().unwrap_or_default());
                let dir = file.parent().unwrap_or(Path::new(""));
                let resolves = markdown && normalize(&dir.join(&path)).is_some_and(|p| self.root.join(p).exists());
                if !resolves {
                    self.fail(file, line_no, format!("cites `{path}`: write docs/{path}"));
                }
            }
        }
        // "issue 9", "issue #10", "issues 7 and 9": this project's issues are not in the
        // repository. An upstream issue names its repository (owner/repo#N, a URL, or a project
        // word before it).
        let words: Vec<&str> = line.split_whitespace().collect();
        for (k, w) in words.iter().enumerate() {
            let w = w.trim_start_matches(['(', '"', '`', '\'']).to_lowercase();
            if w != "issue" && w != "issues" {
                continue;
            }
            let Some(next) = words.get(k + 1) else { continue };
            let next = next.trim_start_matches('#');
            if !next.starts_with(|c: char| c.is_ascii_digit()) {
                continue;
            }
            let prev = if k > 0 { words[k - 1] } else { "" };
            let upstream = line.contains("://")
                || prev.contains(['/', '-'])
                || ["kubernetes", "upstream", "nvidia", "slurm", "github"].contains(&prev.to_lowercase().as_str());
            if !upstream {
                self.fail(
                    file,
                    line_no,
                    format!(
                        "cites `{w} {}`, which is not in the repository: state the requirement itself",
                        words[k + 1].trim_end_matches([':', ';', ',', '.', ')', '"'])
                    ),
                );
            }
        }
    }
}

#[test]
fn every_link_and_citation_resolves() {
    let (markdown, sources) = files();
    assert!(markdown.iter().any(|p| p == Path::new("README.md")), "README.md not found from {}", root().display());
    let mut check = Check { root: root(), texts: HashMap::new(), failures: Vec::new() };
    for file in &markdown {
        let Some(text) = check.text(file) else { continue };
        check.links(file, &text);
        check.repo_paths(file, &text);
        check.citations(file, &text, true);
    }
    for file in &sources {
        let Some(text) = check.text(file) else { continue };
        check.repo_paths(file, &text);
        check.citations(file, &text, false);
    }
    let failures = check.failures;
    assert!(
        failures.is_empty(),
        "{} links or citations do not resolve in this repository ({} markdown and {} source files read):\n{}",
        failures.len(),
        markdown.len(),
        sources.len(),
        failures.join("\n")
    );
}

/// The README stays a front door: short, and it shows the test command `.ci/run` runs.
#[test]
fn readme_is_a_front_door() {
    let readme = fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines; move depth to docs/ (at most 300)");
    assert!(readme.contains("bash hack/test.sh"), "README.md must show the test command, bash hack/test.sh");
}

/// rustfmt does not wrap string literals or comments, so its width (rustfmt.toml's max_width)
/// holds only if a test holds it: every Rust line fits, this file's too.
#[test]
fn every_rust_line_fits_rustfmts_width() {
    let root = root();
    let width: usize = fs::read_to_string(root.join("rustfmt.toml"))
        .expect("rustfmt.toml")
        .lines()
        .find_map(|l| l.strip_prefix("max_width = ")?.trim().parse().ok())
        .expect("rustfmt.toml sets max_width");
    let mut rust = vec![PathBuf::from("build.rs"), PathBuf::from("tests/library/docs.rs")];
    for dir in ["src", "tests", "benches", "hack"] {
        walk(&root, Path::new(dir), &mut |rel| {
            if rel.extension().is_some_and(|e| e == "rs") && rel != Path::new("tests/library/docs.rs") {
                rust.push(rel.to_path_buf());
            }
        });
    }
    let long: Vec<String> = rust
        .iter()
        .flat_map(|rel| {
            let text = fs::read_to_string(root.join(rel)).unwrap_or_default();
            let over: Vec<String> = text
                .lines()
                .enumerate()
                .filter(|(_, l)| l.chars().count() > width)
                .map(|(i, l)| format!("{}:{}: {} characters", rel.display(), i + 1, l.chars().count()))
                .collect();
            over
        })
        .collect();
    assert!(rust.len() > 50, "found only {} Rust files", rust.len());
    assert!(
        long.is_empty(),
        "lines over rustfmt's {width} (split the string or rewrap the comment):\n{}",
        long.join("\n")
    );
}

#[test]
fn slugs_and_section_numbers_follow_github_and_the_facts() {
    assert_eq!(
        slug("Testing the NVML backend without a GPU: `hack/fake-nvml`"),
        "testing-the-nvml-backend-without-a-gpu-hackfake-nvml"
    );
    assert_eq!(slug("Kubernetes 1.34, 1.35 and 1.36+"), "kubernetes-134-135-and-136");
    assert_eq!(slug("1.2 Device names (`mig.go`, `deviceinfo.go`)"), "12-device-names-miggo-deviceinfogo");
    assert_eq!(anchors("# A\n## A\n```\n# not a heading\n```\n").into_iter().collect::<Vec<_>>(), ["a", "a-1"]);
    assert!(heading_is_section("1.4 H100 80GB (SXM5 0x2330)", "1.4"));
    assert!(heading_is_section("0. Rules that apply to every GPU", "0"));
    assert!(heading_is_section("2. The kubelet plugin lifecycle", "2"));
    assert!(!heading_is_section("1.4 H100 80GB", "1"));
    assert!(!heading_is_section("1.10 Known errors", "1.1"));
    assert!(!heading_is_section("10. Other", "1"));
    assert_eq!(section_number(" 2.1)."), Some(("2.1".to_string(), 4)));
    assert_eq!(section_number("N"), None);
}

/// Releases named with their patch (`1.37.2`, `v1.36.3`; Slurm's `26.05.5`) in `text`: each
/// maximal run of digits and dots with exactly three parts, a Kubernetes minor (1.20–1.39) or a
/// Slurm year.month (20–29, 01–12), with its pre-release tag when it has one (`1.38.0-beta.0`).
/// Four-part runs (addresses) are not releases.
fn releases_named(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
            let before = rest[..start].chars().next_back();
            let run_len = rest[start..].find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len() - start);
            let run = rest[start..start + run_len].trim_end_matches('.');
            rest = &rest[start + run_len..];
            // A pre-release (`1.38.0-beta.0`) is a release of its own, named whole.
            let mut named = run.to_string();
            if let Some((tag, num)) = rest.strip_prefix('-').and_then(|t| t.split_once('.')) {
                let digits = num.len() - num.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                if ["alpha", "beta", "rc"].contains(&tag) && digits > 0 && run.len() == run_len {
                    named = format!("{run}-{tag}.{}", &num[..digits]);
                    rest = &num[digits..];
                }
            }
            if before.is_some_and(|c| c.is_ascii_alphanumeric() && c != 'v') {
                continue;
            }
            let parts: Vec<&str> = run.split('.').collect();
            if parts.len() != 3 || parts.iter().any(|p| p.is_empty()) {
                continue;
            }
            let (major, minor) = (parts[0], parts[1]);
            let kubernetes = major == "1" && minor.len() == 2 && ("20".."40").contains(&minor);
            let slurm =
                major.len() == 2 && ("20".."30").contains(&major) && minor.len() == 2 && ("01".."13").contains(&minor);
            if kubernetes || slurm {
                out.push((n + 1, named));
            }
        }
    }
    out
}

/// Every Kubernetes or Slurm release a document or a doc comment names is one CI tests
/// (`migdra::cli::tested`, which `migdra --version` prints), and that list is the one hack/ pins:
/// the `k8s.io/kubernetes` of each `hack/controlplane-<minor>` and `hack/kubelet-<minor>` module,
/// and the node's containerd and runc. Facts files are left out: they cite upstream releases
/// they were read from, not what runs here.
#[test]
fn every_release_named_is_one_ci_tests() {
    use migdra::cli::tested;
    let root = root();
    let mut failures = Vec::new();
    let (markdown, sources) = files();
    let mut named = 0;
    for file in markdown.iter().chain(sources.iter().filter(|p| p.extension().is_some_and(|e| e == "rs"))) {
        if file.starts_with("docs/facts") {
            continue;
        }
        let Ok(mut text) = fs::read_to_string(root.join(file)) else { continue };
        if file.extension().is_some_and(|e| e == "rs") {
            // Doc comments only (they are also `--help`); literals in code are test inputs.
            let doc = |l: &str| ["///", "//!"].iter().any(|p| l.trim_start().starts_with(p));
            text = text.lines().map(|l| if doc(l) { l } else { "" }).collect::<Vec<_>>().join("\n");
        }
        for (line, release) in releases_named(&text) {
            named += 1;
            if !tested::KUBERNETES.contains(&release.as_str()) && !tested::SLURM.contains(&release.as_str()) {
                failures.push(format!("{}:{line}: {release} is not a release CI tests", file.display()));
            }
        }
    }
    // The list against the pins.
    let mut pinned = BTreeSet::new();
    for entry in fs::read_dir(root.join("hack")).expect("hack/") {
        let dir = entry.expect("an entry of hack/").path();
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let Some(minor) = name.strip_prefix("controlplane-").or_else(|| name.strip_prefix("kubelet-")) else {
            continue;
        };
        let go_mod = fs::read_to_string(dir.join("go.mod")).unwrap_or_default();
        let pin = go_mod
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                l.strip_prefix("require ").unwrap_or(l).strip_prefix("k8s.io/kubernetes v")
            })
            .next()
            .unwrap_or_else(|| panic!("hack/{name}/go.mod requires no k8s.io/kubernetes"))
            .to_string();
        if !pin.starts_with(&format!("{minor}.")) {
            failures.push(format!("hack/{name}: pins Kubernetes {pin}, not {minor}"));
        }
        pinned.insert(pin);
    }
    let listed: BTreeSet<String> = tested::KUBERNETES.iter().map(|s| s.to_string()).collect();
    if pinned != listed {
        failures.push(format!("hack/ pins Kubernetes {pinned:?}; src/cli/tested.rs lists {listed:?}"));
    }
    let node = fs::read_to_string(root.join("hack/build-node.sh")).expect("hack/build-node.sh");
    for (var, want) in [("containerd_version=v", tested::CONTAINERD), ("runc_version=v", tested::RUNC)] {
        let got = node.lines().find_map(|l| l.strip_prefix(var)).unwrap_or_default();
        if got != want {
            failures.push(format!("hack/build-node.sh: {var}{got}, src/cli/tested.rs says {want}"));
        }
    }
    assert!(named > 0, "no release named anywhere: the scan is broken");
    assert!(failures.is_empty(), "{} releases drift:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn releases_are_found_and_addresses_are_not() {
    let text = "run on v1.37.2 and 1.36.3, Slurm 26.05.5, v1.38.0-beta.0 and 1.38.0-rc.1; \
                not 127.0.0.1, 10.1.30.5, x1.36.3, 1.5.3, 2026.11.30 or 1.38.0-foo.1";
    let found: Vec<String> = releases_named(text).into_iter().map(|(_, r)| r).collect();
    assert_eq!(found, ["1.37.2", "1.36.3", "26.05.5", "1.38.0-beta.0", "1.38.0-rc.1", "1.38.0"]);
}
