"""`gaudi-cluster doctor`: survey every node in parallel and print the preflight findings.

The checks themselves are pure and live in `checks`; the master runs the same ones before every
launch (unless --skip-doctor), so what the doctor reports is what would block a job.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TextIO

from gaudi_cluster.launch.prepare import job_env_for, user_env_files
from gaudi_cluster.launch.program import output_dir, program_from_args, required_paths, resolve_accelerator
from gaudi_cluster.nodes import checks
from gaudi_cluster.nodes.survey import survey_nodes
from gaudi_cluster.settings.config import ClusterConfig


def run_doctor(
    config: ClusterConfig, environ: Mapping[str, str], out: TextIO, json_only: bool = False
) -> int:
    program = program_from_args([], sys.executable, resolve_accelerator(config.accelerator, environ), environ)
    survey = survey_nodes(
        config, required_paths(program, os.getcwd()), environ, output_dir=output_dir(program, environ)
    )
    accelerator = resolve_accelerator(config.accelerator, environ, survey.master_report)
    env_file = job_env_for(config, accelerator, survey, environ, user_env_files(environ))
    findings = checks.check_nodes(
        survey.reports,
        survey.unreachable,
        survey.requested_slots,
        survey.socket_ifname,
        env_file.as_dict(),
        survey.paths,
        min_free_disk=config.min_free_disk,
    )
    # Which scale-out path the ranks would take, and why (`auto` decides from the master's probe).
    preset = f"{env_file.preset} ({env_file.preset_reason})"
    findings.append(checks.Finding(survey.hosts[0], "env preset", True, preset))
    if not json_only:
        out.write(checks.render_table(findings) + "\n\n")
    out.write(checks.render_json(findings) + "\n")
    problems = checks.blocking(findings)
    if problems:
        first = problems[0]
        print(
            f"gaudi-cluster: doctor: {len(problems)} blocking problem(s); first: {first.host} {first.check}: "
            f"{first.detail}; fix: {first.fix}",
            file=sys.stderr,
        )
        return 3
    return 0
