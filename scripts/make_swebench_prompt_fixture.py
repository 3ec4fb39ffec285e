"""Writes tasks/swebench/prompts/style-3-FIXTURE.jsonl: a FIXTURE in the schema of princeton-nlp/SWE-bench_oracle
and SWE-bench_bm25_13K (the instance columns plus `text`), built from five bundled SWE-bench Lite dev rows.

The real prompt sets put whole source files (the gold patch's files for oracle, BM25-retrieved files for bm25)
inside `<code>`; those files are not available offline. Here `<code>` holds only the gold patch's pre-image
lines (its context and removed lines, which are real lines of the file at base_commit, with their line numbers),
so the layout and the columns match and the text is much shorter. Measurements on it are NOT measurements on the
real prompt sets. Rerun: python scripts/make_swebench_prompt_fixture.py
"""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tasks" / "swebench" / "instances" / "princeton-nlp-SWE-bench_Lite-dev.json"
OUT = ROOT / "tasks" / "swebench" / "prompts" / "style-3-FIXTURE.jsonl"
CHOSEN = ["sqlfluff__sqlfluff-1625", "marshmallow-code__marshmallow-1359", "pvlib__pvlib-python-1072",
          "pylint-dev__astroid-1268", "pydicom__pydicom-1256"]
COLUMNS = ["instance_id", "text", "repo", "base_commit", "problem_statement", "hints_text", "created_at", "patch",
           "test_patch", "version", "FAIL_TO_PASS", "PASS_TO_PASS", "environment_setup_commit"]
# the first line is SWE-bench's style-3 premise (swebench.inference.make_datasets.create_instance, MIT): run_api
# sends the first line of `text` as the system message
PREMISE = "You will be provided with a partial code base and an issue statement explaining a problem to resolve."
EXAMPLE = "\n".join(["--- a/example.py", "+++ b/example.py", "@@ -1,3 +1,3 @@", " def half(x):",
                     "-    return x / 3", "+    return x / 2", " "])
HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")


def pre_image(patch: str) -> dict[str, list[str]]:
    """path → numbered lines of the file before the patch (context and removed lines of each hunk)."""
    files: dict[str, list[str]] = {}
    path, line = None, 0
    for raw in patch.splitlines():
        if raw.startswith("--- a/"):
            path = raw[len("--- a/"):]
            files.setdefault(path, [])
        elif (found := HUNK.match(raw)) and path:
            line = int(found.group(1))
            if files[path]:
                files[path].append("...")
        elif path and raw[:1] in (" ", "-") and not raw.startswith("---"):
            files[path].append(f"{line} {raw[1:]}")
            line += 1
    return files


def text_for(row: dict) -> str:
    code = []
    for path, lines in pre_image(row["patch"]).items():
        code += [f"[start of {path}]", *lines, f"[end of {path}]"]
    return "\n".join([
        PREMISE, "<issue>", row["problem_statement"], "</issue>", "", "<code>", *code, "</code>", "",
        "Here is an example of a patch file. It changes a file; it names the file, the line numbers of the change "
        "and the removed and added lines.", "<patch>", EXAMPLE, "</patch>", "",
        "Solve the issue above with a single patch file that git apply can apply to this repository, in the "
        "format shown above.", "Respond below:"])


def main() -> None:
    rows = {r["instance_id"]: r for r in json.loads(SOURCE.read_text())}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w") as out:
        for instance in CHOSEN:
            row = rows[instance]
            record = {key: row.get(key) for key in COLUMNS if key != "text"}
            record["text"] = text_for(row)
            out.write(json.dumps({key: record[key] for key in COLUMNS}) + "\n")
    print(f"wrote {len(CHOSEN)} rows to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
