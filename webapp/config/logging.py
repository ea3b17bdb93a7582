"""A log formatter that keeps every record on one line: time, level, logger, message."""

from __future__ import annotations

import logging


class OneLineFormatter(logging.Formatter):
    """``2025-01-01T00:00:00 level=INFO logger=webapp.x msg="..."``; tracebacks folded in.

    Newlines inside the message or a traceback are written as ``\\n`` so that a log shipper
    reading line by line never splits one record into several.
    """

    def __init__(self) -> None:
        super().__init__(datefmt="%Y-%m-%dT%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        if record.stack_info:
            message = f"{message}\n{self.formatStack(record.stack_info)}"
        message = message.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        when = self.formatTime(record, self.datefmt)
        line = f'{when} level={record.levelname} logger={record.name} msg="{message}"'
        request_id = getattr(record, "request_id", None)  # logger.info(..., extra={"request_id": id})
        return line if request_id is None else f"{line} request_id={request_id}"
