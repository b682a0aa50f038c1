//! The README's events example is the runnable example's code: the block
//! between the `README` markers of `examples/pipeline.rs`, unindented, is a
//! code block of README.md.

#[test]
fn the_readme_shows_the_pipeline_example_as_it_runs() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/pipeline.rs"))
            .expect("the example");
    let begin = example.find("// README: begin\n").expect("begin marker") + 17;
    let end = example.find("    // README: end").expect("end marker");
    let block: Vec<&str> = example[begin..end]
        .lines()
        .map(|line| line.strip_prefix("    ").unwrap_or(line))
        .collect();
    let block = format!("```rust\n{}\n```", block.join("\n").trim_end());
    assert!(
        readme.contains(&block),
        "README.md must contain the example's block:\n{block}"
    );
}
