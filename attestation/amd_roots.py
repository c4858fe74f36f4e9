"""The AMD SEV-SNP root keys (ARKs) a report's certificate chain must end in, pinned.

Each value is the SHA-256 of the ARK's SubjectPublicKeyInfo (DER), keyed by the product the
ARK certifies. These are AMD's public ARK keys as served by the AMD Key Distribution Service at
https://kdsintf.amd.com/vcek/v1/{Milan,Genoa,Turin}/cert_chain (the second certificate of each
chain, self-signed with RSA-PSS SHA-384). The digests were computed once from the copies of
those chains in the public test vectors (go-sev-guest ``verify/trust/ask_ark_*.pem``, virtee/sev
``tests/certs_data/cert_chain_*``) and are written here as constants; nothing in this module
reads a file or the network. The VLEK chains (ASVK) end in the same ARKs.

A root key is trusted only by being listed here (or in the ``trusted_roots`` a caller passes
to ``attestation.snp.verify_snp`` explicitly, e.g. a test chain): a self-signed certificate
that merely says "ARK-Milan" proves nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["AMD_ARK_SPKI_SHA256"]

#: Product name → SHA-256 (hex) of that product's ARK SubjectPublicKeyInfo, DER.
AMD_ARK_SPKI_SHA256: Mapping[str, str] = MappingProxyType(
    {
        # CN=ARK-Milan, valid 2020-10-22 .. 2045-10-22 (RSA 4096)
        "Milan": "9f056bee44377e29308cb5ffa895bdfb62d18881fa6bed8d6f075b0204089cb9",
        # CN=ARK-Genoa, valid 2022-01-26 .. 2047-01-26 (RSA 4096)
        "Genoa": "429a69c9422aa258ee4d8db5fcda9c6470ef15f8cd5a9cebd6cbc7d90b863831",
        # CN=ARK-Turin, valid 2023-05-15 .. 2048-05-15 (RSA 4096)
        "Turin": "4f125410563a2ab9a50356f9243f6fe0b6f73de98603f53f90339c70e9d7ad08",
    }
)
