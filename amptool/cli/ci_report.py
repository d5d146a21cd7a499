"""Diff results in the formats CI systems read: JUnit XML and GitHub Actions annotations.

Pure formatting of a :class:`~amptool.app.diff.DiffReport`: one JUnit ``<testcase>`` per model
output (classname: the model file's name), a ``<failure>`` with the output's failure text when
it failed, the verdict line in ``<system-out>``. On GitHub Actions (``GITHUB_ACTIONS=true``) each
failing output also becomes an ``::error`` workflow command, shown on the run's summary page.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import TYPE_CHECKING

from amptool.fileio import atomic_write

if TYPE_CHECKING:
    from amptool.app.diff import DiffReport

#: The ``title=`` of every annotation diff prints.
ANNOTATION_TITLE = "amptool diff"


def junit_xml(report: DiffReport, seconds: float) -> bytes:
    """The report as a JUnit XML document; ``seconds`` (the whole diff) is shared among the outputs."""
    classname = os.path.basename(report.model)
    failed = [o for o in report.outputs if not o["passed"]]
    total = f"{seconds:.3f}"
    each = f"{seconds / max(len(report.outputs), 1):.3f}"
    suites = ET.Element("testsuites", name="amptool diff", tests=str(len(report.outputs)),
                        failures=str(len(failed)), errors="0", time=total)
    suite = ET.SubElement(suites, "testsuite", name=f"amptool diff {classname} {report.dtype} on {report.target}",
                          tests=str(len(report.outputs)), failures=str(len(failed)), errors="0", skipped="0",
                          time=total)
    for output in report.outputs:
        case = ET.SubElement(suite, "testcase", classname=classname, name=str(output["name"]), time=each)
        if not output["passed"]:
            failure = ET.SubElement(case, "failure", message=str(output["failure"]),
                                    type=str(output.get("failed_check") or "accuracy"))
            failure.text = f"output '{output['name']}': {output['failure']}"
    ET.SubElement(suite, "system-out").text = report.verdict
    ET.indent(suites)
    return bytes(ET.tostring(suites, encoding="utf-8", xml_declaration=True)) + b"\n"


def write_junit(path: str, report: DiffReport, seconds: float) -> None:
    """Write :func:`junit_xml` to ``path`` atomically."""
    data = junit_xml(report, seconds)
    with atomic_write(path, "wb", "--junit-xml") as handle:
        handle.write(data)


def on_github_actions(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get("GITHUB_ACTIONS") == "true"


def github_annotations(report: DiffReport) -> list[str]:
    """``::error title=amptool diff::output 'NAME': <failure>`` per failing output."""
    return [f"::error title={ANNOTATION_TITLE}::" + _escape(f"output '{o['name']}': {o['failure']}")
            for o in report.outputs if not o["passed"]]


def _escape(message: str) -> str:
    """A workflow command's message ends at a newline; GitHub decodes %25, %0D and %0A."""
    return message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
