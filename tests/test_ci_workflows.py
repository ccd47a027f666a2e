"""The CI workflows for users' CI services (GitHub Actions, GitLab CI): valid by their linters, and running the same
test command as .ci/run, so the three cannot drift apart."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import loopback

ROOT = Path(__file__).resolve().parents[1]
GITHUB = ROOT / ".github" / "workflows" / "ci.yml"
GITLAB = ROOT / ".gitlab-ci.yml"
CI_RUN = ROOT / ".ci" / "run"


def linter(tool: str) -> str:
    """A linter of the `test` extra, found beside the Python running the tests even when its venv is not activated."""
    executable = shutil.which(tool, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    assert executable, f"{tool} is not installed: pip install -e '.[test]'"
    return executable


def lint(tool: str, *args: str) -> subprocess.CompletedProcess:
    """Runs a linter of the `test` extra; the linters work offline."""
    return subprocess.run([linter(tool), *args], cwd=ROOT, capture_output=True, text=True)


def job_commands(path: Path) -> dict[str, list[str]]:
    """Each job's shell commands, one per line of its `run:` steps (GitHub) or `script:` (GitLab)."""
    workflow = yaml.safe_load(path.read_text())
    if path == GITHUB:
        blocks = {
            name: [step["run"] for step in job["steps"] if "run" in step] for name, job in workflow["jobs"].items()
        }
    else:
        blocks = {name: job["script"] for name, job in workflow.items() if isinstance(job, dict) and "script" in job}
    return {
        name: [line.strip() for block in lines for line in block.splitlines() if line.strip()]
        for name, lines in blocks.items()
    }


def ci_run_commands() -> list[str]:
    """What .ci/run runs, less its shell set-up (set, cd) and its banner (echo)."""
    lines = [line.strip() for line in CI_RUN.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "set ", "cd ", "echo "))]


@pytest.mark.parametrize(
    ("workflow", "schema"),
    [(GITHUB, "vendor.github-workflows"), (GITLAB, "vendor.gitlab-ci")],
    ids=["github", "gitlab"],
)
def test_workflows_match_their_services_schemas(workflow, schema):
    result = lint("check-jsonschema", "--builtin-schema", schema, str(workflow))
    assert result.returncode == 0, result.stdout + result.stderr


def test_github_workflow_passes_zizmor():
    """zizmor checks what a schema cannot (permissions, credentials left on disk, injection from event text, pins),
    under the policy in .github/zizmor.yml."""
    result = lint("zizmor", "--offline", "--no-progress", "--color", "never", str(GITHUB))
    assert result.returncode == 0, result.stdout + result.stderr


def test_github_workflow_passes_actionlint():
    """actionlint checks what the others do not: the expressions and their types, each action's inputs, and, through
    shellcheck, the shell of every `run:` step. Without a shellcheck it skips that part silently, so it is given the
    one of the `test` extra. (It knows an action's runtime, node20 or node24, from a tag only, not from a commit.)"""
    result = lint("actionlint", "-no-color", "-shellcheck", linter("shellcheck"), str(GITHUB))
    assert result.returncode == 0, result.stdout + result.stderr


def test_scripts_the_workflows_call_pass_shellcheck():
    """The workflows keep their logic in scripts/, where shellcheck reads it."""
    called = {
        match
        for path in (GITHUB, GITLAB)
        for commands in job_commands(path).values()
        for command in commands
        for match in re.findall(r"\bbash (\S+)", command)
    }
    assert called, "no script found in the workflows"
    result = lint("shellcheck", "--severity=warning", str(CI_RUN), *sorted(called))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("workflow", [GITHUB, GITLAB], ids=["github", "gitlab"])
def test_workflows_test_job_runs_what_ci_run_runs(workflow):
    expected = ci_run_commands()
    assert expected, ".ci/run runs no command"
    test_job = job_commands(workflow)["test"]
    assert [command for command in test_job if command in expected] == expected, (
        f"{workflow.name}'s test job must run .ci/run's commands {expected}, in order; it runs {test_job}"
    )


@pytest.mark.parametrize("workflow", [GITHUB, GITLAB], ids=["github", "gitlab"])
def test_workflows_publish_the_regenerated_reports_with_their_diff(workflow):
    commands = job_commands(workflow)["reports"]
    assert commands.index("bash scripts/repro.sh") < commands.index("bash scripts/report_diff.sh > report-diff.md")
    parsed = yaml.safe_load(workflow.read_text())
    if workflow == GITHUB:
        assert 'cat report-diff.md >> "$GITHUB_STEP_SUMMARY"' in commands
        uploads = [
            step["with"]["path"]
            for step in parsed["jobs"]["reports"]["steps"]
            if step.get("uses", "").startswith("actions/upload-artifact@")
        ]
        published = uploads[0].split()
    else:
        published = parsed["reports"]["artifacts"]["paths"]
    assert published == ["reports/", "report-diff.md"]


@pytest.fixture
def refusing_unshare(tmp_path, monkeypatch):
    """`unshare` and `ip` on the PATH as on a runner whose containers are not privileged: `unshare` refuses."""
    for name, body in {
        "unshare": 'echo "unshare: unshare failed: Operation not permitted" >&2; exit 1',
        "ip": "exit 0",
    }.items():
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    loopback.netns_refusal.cache_clear()
    yield
    loopback.netns_refusal.cache_clear()


def test_a_refused_network_namespace_skips_the_test_only_where_the_runner_allows_it(refusing_unshare, monkeypatch):
    monkeypatch.setenv(loopback.ALLOW_NO_NETNS, "1")
    with pytest.raises(pytest.skip.Exception, match="refuses a network namespace.*Operation not permitted"):
        loopback.run_on_loopback(["true"], timeout=60)
    monkeypatch.delenv(loopback.ALLOW_NO_NETNS)
    with pytest.raises(pytest.fail.Exception, match="failed inside the loopback-only namespace"):
        loopback.run_on_loopback(["true"], timeout=60)


def test_only_the_gitlab_test_job_lets_the_network_isolated_tests_skip():
    """GitLab's shared runners refuse `unshare --net`; this project's CI and the GitHub workflow's privileged container
    give it, so there a refused namespace must fail."""
    gitlab = yaml.safe_load(GITLAB.read_text())
    assert gitlab["test"]["variables"][loopback.ALLOW_NO_NETNS] == "1"
    assert loopback.ALLOW_NO_NETNS not in gitlab.get("variables", {})
    for path in (GITHUB, CI_RUN, ROOT / "scripts" / "test.sh"):
        assert loopback.ALLOW_NO_NETNS not in path.read_text(), f"{path.name} lets a refused namespace skip"
