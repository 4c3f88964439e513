"""Master (the doctor role, where a job's master would run): `gaudi-cluster doctor` surveys every
node in parallel and prints the preflight findings (a table, or with --json the findings as JSON and
nothing else).

The checks themselves are pure and live in `checks`; the master runs the same ones before every
launch (unless --skip-doctor), so what the doctor reports is what would block a job.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import TextIO

from gaudi_cluster.job import fabric_check
from gaudi_cluster.job.attempt import survey_for
from gaudi_cluster.job.settings import JobSettings
from gaudi_cluster.launch import plan
from gaudi_cluster.launch.prepare import job_env_for, staged_values
from gaudi_cluster.launch.program import program_from_args
from gaudi_cluster.nodes import checks
from gaudi_cluster.nodes.devices import resolve_accelerator
from gaudi_cluster.settings.config import ClusterConfig


def run_doctor(
    config: ClusterConfig,
    environ: Mapping[str, str],
    out: TextIO,
    json_only: bool = False,
    with_fabric: bool = False,
) -> int:
    settings = JobSettings.from_config(config)
    program = program_from_args(
        [], sys.executable, resolve_accelerator(settings.accelerator, environ), environ, os.getcwd()
    )
    survey = survey_for(settings, program, environ)
    try:
        accelerator = resolve_accelerator(settings.accelerator, environ, survey.master_report)
        staged = staged_values(settings.env_pass, environ)
        env_file = job_env_for(settings.prepare, accelerator, survey, environ, staged)
        findings = survey.preflight(env_file.as_dict(), settings.prepare.min_free_disk)
    finally:
        survey.release()  # the doctor launches nothing: its shared ssh connections end here
    # Which scale-out path the ranks would take, and why (`auto` decides from the master's probe).
    preset = f"{env_file.preset} ({env_file.preset_reason})"
    findings.append(checks.Finding(survey.hosts[0], "env preset", True, preset))
    problems = checks.blocking(findings)
    # Ranks can start only where the preflight passes.
    if (with_fabric or settings.fabric.enabled) and not problems:
        return run_fabric(settings, environ, out, findings, json_only)
    # A person reads the table; a tool asks for --json and gets nothing else on stdout.
    out.write((checks.render_json(findings) if json_only else checks.render_table(findings)) + "\n")
    if problems:
        first = problems[0]
        print(
            f"gaudi-cluster: doctor: {len(problems)} blocking problem(s); first: {first.host} {first.check}: "
            f"{first.detail}; fix: {first.fix}",
            file=sys.stderr,
        )
        return 3
    return 0


def run_fabric(
    settings: JobSettings,
    environ: Mapping[str, str],
    out: TextIO,
    findings: list[checks.Finding],
    json_only: bool,
) -> int:
    """`doctor --fabric-check`: the all-reduce check after the preflight; exit 3 names the node to drop.
    With --json one document: {"findings": [...], "fabric": {...}}."""
    if not json_only:
        out.write(checks.render_table(findings) + "\n")
        out.flush()
    # The nodes the job would use: --include/--exclude apply to the check as to the launch.
    options = plan.LaunchOptions(include=settings.include, exclude=settings.exclude)
    result = fabric_check.run_check(settings, environ, options)
    if json_only:
        document = {
            "findings": json.loads(checks.render_json(findings)),
            "fabric": result.to_dict(),
        }
        out.write(json.dumps(document, indent=2) + "\n")
    else:
        out.write(fabric_check.render_table(result) + "\n")
    out.flush()
    if not result.ok:
        print(fabric_check.stop_line(result), file=sys.stderr)
        return 3
    return 0
