"""`gaudi-cluster doctor`: survey every node in parallel and print the preflight findings (a table, or
with --json the findings as JSON and nothing else).

The checks themselves are pure and live in `checks`; the master runs the same ones before every
launch (unless --skip-doctor), so what the doctor reports is what would block a job.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import TextIO

from gaudi_cluster import fabric, master
from gaudi_cluster.launch import plan
from gaudi_cluster.launch.prepare import PrepareSettings, job_env_for, staged_values
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
    program = program_from_args(
        [], sys.executable, resolve_accelerator(config.accelerator, environ), environ, os.getcwd()
    )
    survey = master.survey_for(config, program, environ)
    try:
        accelerator = resolve_accelerator(config.accelerator, environ, survey.master_report)
        settings = PrepareSettings.from_config(config)
        env_file = job_env_for(
            settings, accelerator, survey, environ, staged_values(config.env_pass, environ)
        )
        findings = survey.preflight(env_file.as_dict(), config.min_free_disk)
    finally:
        survey.release()  # the doctor launches nothing: its shared ssh connections end here
    # Which scale-out path the ranks would take, and why (`auto` decides from the master's probe).
    preset = f"{env_file.preset} ({env_file.preset_reason})"
    findings.append(checks.Finding(survey.hosts[0], "env preset", True, preset))
    problems = checks.blocking(findings)
    if (
        with_fabric or config.fabric_check
    ) and not problems:  # ranks can start only where the preflight passes
        return run_fabric(config, environ, out, findings, json_only)
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
    config: ClusterConfig,
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
    options = plan.LaunchOptions(include=config.include, exclude=config.exclude)
    result, _ = fabric.run_check(config, environ, master.prepare_attempt, master.run_prepared, options)
    if json_only:
        document = {
            "findings": json.loads(checks.render_json(findings)),
            "fabric": json.loads(result.to_json()),
        }
        out.write(json.dumps(document, indent=2) + "\n")
    else:
        out.write(fabric.render_table(result) + "\n")
    out.flush()
    if not result.ok:
        print(fabric.stop_line(result), file=sys.stderr)
        return 3
    return 0
