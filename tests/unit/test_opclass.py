"""The client's request accounting and the emulator name and price requests alike.

Both read one table (``torchbucket._opclass``); this checks the two parsers that
map a request onto an operation name agree, request by request, so a class A
write counted by the emulator is a class A write in ``torchbucket.accounting``.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from torchbucket._opclass import OP_CLASS, OPERATIONS
from torchbucket.emulator._faults import OPERATIONS as FAULT_OPERATIONS
from torchbucket.emulator._routes import parse_route
from torchbucket.runtime.accounting import classify

REQUESTS = [
    ("GET", "/storage/v1/b/bk/o", "prefix=a%2F&maxResults=1000"),
    ("GET", "/storage/v1/b/bk/o/a%2Fb", "alt=media"),
    ("GET", "/storage/v1/b/bk/o/a%2Fb", ""),
    ("DELETE", "/storage/v1/b/bk/o/a%2Fb", ""),
    ("PATCH", "/storage/v1/b/bk/o/a%2Fb", ""),
    ("POST", "/storage/v1/b/bk/o/a%2Fb/compose", ""),
    ("POST", "/storage/v1/b/bk/o/a/rewriteTo/b/bk/o/c", ""),
    ("POST", "/storage/v1/b/bk/o/a/moveTo/o/c", ""),
    ("POST", "/upload/storage/v1/b/bk/o", "uploadType=media&name=a"),
    ("POST", "/upload/storage/v1/b/bk/o", "uploadType=resumable&name=a"),
    ("POST", "/storage/v1/b", "project=p"),
    ("GET", "/storage/v1/b", "project=p"),
    ("GET", "/storage/v1/b/bk", ""),
    ("DELETE", "/storage/v1/b/bk", ""),
    ("GET", "/storage/v1/b/bk/iam/testPermissions", "permissions=storage.objects.get"),
    ("POST", "/bk/a", "uploads"),
    ("PUT", "/bk/a", "partNumber=1&uploadId=u"),
    ("POST", "/bk/a", "uploadId=u"),
    ("DELETE", "/bk/a", "uploadId=u"),
    ("GET", "/bk/a", "uploadId=u"),
    ("GET", "/bk/a", ""),
    ("PUT", "/bk/a", ""),
]


@pytest.mark.parametrize(("method", "path", "query"), REQUESTS)
def test_client_and_emulator_name_a_request_alike(method: str, path: str, query: str) -> None:
    emulator_op = parse_route(method, path, dict(parse_qsl(query, keep_blank_values=True))).op
    assert classify(method, path, query) == emulator_op
    assert emulator_op in OP_CLASS


def test_one_table_of_operations() -> None:
    assert set(FAULT_OPERATIONS) == set(OPERATIONS)
    assert OP_CLASS["move"] == "A" and OP_CLASS["delete"] == "free" and OP_CLASS["get"] == "B"
