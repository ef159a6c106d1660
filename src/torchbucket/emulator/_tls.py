"""HTTPS for the emulator: a throwaway CA and a server certificate for 127.0.0.1.

A client trusts the CA through the standard variables: ``SSL_CERT_FILE`` (what
Python's ``ssl`` and so torchbucket's aiohttp sessions read) and
``REQUESTS_CA_BUNDLE`` (``requests``: google-auth, google-cloud-storage), both
set to :attr:`Emulator.ca_file <torchbucket.emulator.Emulator.ca_file>`.
"""

from __future__ import annotations

import os
import ssl
import urllib.request

from torchbucket.errors import ConfigError

__all__ = ["admin_opener", "make_certs"]


def make_certs(directory: str) -> tuple[str, str, str]:
    """Write a new CA and a certificate it issued for ``127.0.0.1`` and ``localhost``.

    Returns:
        ``(ca_file, cert_file, key_file)``, PEM files in ``directory``.

    Raises:
        ConfigError: ``trustme`` is not installed (the ``emulator`` and ``dev`` extras).
    """
    try:
        import trustme
    except ImportError as exc:
        raise ConfigError(
            "Emulator(tls=True) needs the trustme package: pip install 'torchbucket[emulator]'"
        ) from exc
    ca = trustme.CA(organization_name="torchbucket emulator")
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = tuple(os.path.join(directory, n) for n in ("ca.pem", "server.pem", "server.key"))
    ca.cert_pem.write_to_path(paths[0])
    with open(paths[1], "wb") as f:
        for blob in cert.cert_chain_pems:
            f.write(blob.bytes())
    cert.private_key_pem.write_to_path(paths[2])
    return paths[0], paths[1], paths[2]


def admin_opener(ca_file: str) -> urllib.request.OpenerDirector:
    """A urllib opener that trusts ``ca_file`` and uses no proxy."""
    context = ssl.create_default_context(cafile=ca_file)
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
