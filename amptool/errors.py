"""User errors vs bugs.

A ``UserError`` is something the user can fix (bad file, bad flag, unsupported model): the CLI
prints one line and a hint, and exits with the error's documented code — never a traceback.
Anything else is a bug and shows a traceback.

Exit codes (an interface: CI scripts depend on them):
  0  success / accuracy check passed
  1  accuracy check failed
  2  user error (bad input, bad flag, unsupported model)
  3  target unavailable on this machine (missing codegen, toolchain or device)
  70 internal error: a bug in amptool or TVM (BSD's EX_SOFTWARE); one line, traceback with -v
"""

from __future__ import annotations

import re

EXIT_OK = 0
EXIT_ACCURACY_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_TARGET_UNAVAILABLE = 3
EXIT_INTERNAL_ERROR = 70


def error_summary(err: BaseException, *, last: bool = False, limit: int = 300) -> str:
    """One line of an exception's text for a user-facing message.

    ``last=True`` for TVM errors, whose message ends with the meaningful line after a
    C++ backtrace; the first line otherwise (protobuf, onnx checker, onnxruntime).
    """
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    return (lines[-1] if last else lines[0])[:limit]


class UserError(Exception):
    """A problem with the user's input; rendered as one line plus a hint."""

    exit_code = EXIT_USER_ERROR

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class TargetUnavailableError(UserError):
    """The requested target cannot be built or run on this machine."""

    exit_code = EXIT_TARGET_UNAVAILABLE


#: Start of the message of a model-raised run-time failure: an If branch amptool imported as one that
#: raises because it does not type at the pinned shapes (frontend/control_flow.py). The runtime turns
#: it into a one-line refusal, as onnxruntime refuses a model that fails at run time.
BRANCH_RAISE_MARKER = "the model took an If branch that cannot run at these input shapes"
#: Most iterations a Loop that runs at run time may take (frontend/loop_function.py: the VM takes a
#: stack frame per iteration), and the code the loop computes for the VM to check — plus its bound
#: past the bound, and the VM's error then reads "(<code + bound> vs. 4279632) … R.Shape([4279632])"
#: ("AMP" in hex).
LOOP_BOUND = 100_000
LOOP_BOUND_CODE = 0x414D50


def model_raised(err: BaseException) -> UserError | None:
    """The refusal for a run-time failure the model itself raised, or None for any other error."""
    text = str(err)
    if f"R.Shape([{LOOP_BOUND_CODE}])" in text:
        found = re.search(rf"\((\d+) vs\. {LOOP_BOUND_CODE}\)", text)
        bound = int(found.group(1)) - LOOP_BOUND_CODE if found else LOOP_BOUND
        return UserError(f"The model failed at run time: a Loop ran past amptool's bound of {bound:,} iterations "
                         "(each holds the values it passes on until the loop ends)",
                         "Check the inputs that decide the loop's exit (it may never end on them); a loop "
                         "whose trip count is fixed by --fixed-input or --input-shape unrolls instead.")
    if BRANCH_RAISE_MARKER not in text:
        return None
    detail = text[text.index(BRANCH_RAISE_MARKER):].splitlines()[0]
    return UserError(f"The model failed at run time: {detail[:400]}",
                     "Feed values that take the branch the build was made for (the convert warning names "
                     "the If and the input deciding it), or pin other input shapes with --input-shape.")
