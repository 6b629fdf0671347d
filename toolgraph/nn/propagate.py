"""Parameter-free graph convolution over tool vectors (TGR: X' = D^-1/2 (A + I) D^-1/2 X, applied
``layers`` times). Plain torch sparse ops, no PyG needed.

Edges are dependencies ``(s, t)``: tool s needs tool t first. ``direction`` says who reads whom:
* ``to_prerequisite``: row t gathers from s — a prerequisite (GetUserToken) moves towards the
  tools that need it (DeleteAccount), so a request for the dependent also finds the prerequisite;
* ``to_dependent``: row s gathers from t (the dependent moves towards its prerequisites);
* ``symmetric``: both.
D is the row degree of A + I (each row averages what it reads, with symmetric normalisation).
"""

from __future__ import annotations

import torch

DIRECTIONS = ("to_prerequisite", "to_dependent", "symmetric")


def normalized_adjacency(edges: torch.Tensor, n: int, direction: str = "to_prerequisite") -> torch.Tensor:
    """edges [E, 2] (s needs t) -> sparse D^-1/2 (A + I) D^-1/2, [n, n], duplicates merged."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    edges = edges.long().reshape(-1, 2)
    edges = edges[edges[:, 0] != edges[:, 1]]  # self-loops come from + I
    s, t = edges[:, 0], edges[:, 1]
    rows, cols = {"to_prerequisite": (t, s), "to_dependent": (s, t),
                  "symmetric": (torch.cat([t, s]), torch.cat([s, t]))}[direction]
    loop = torch.arange(n)
    index = torch.stack([torch.cat([rows, loop]), torch.cat([cols, loop])])  # [2, E' + n]
    index = torch.unique(index, dim=1)  # a repeated edge counts once; sorted row-major
    r, c = index
    deg = torch.bincount(r, minlength=n).float()  # [n] row degree of A + I, >= 1
    values = deg[r].rsqrt() * deg[c].rsqrt()
    return torch.sparse_coo_tensor(index, values, (n, n), is_coalesced=True, check_invariants=False)


def gcn_smooth(x: torch.Tensor, edges: torch.Tensor, layers: int = 1, direction: str = "to_prerequisite",
               alpha: float = 1.0) -> torch.Tensor:
    """x [n, H] -> ``layers`` times x <- (1 - alpha) x + alpha D^-1/2 (A + I) D^-1/2 x, [n, H].
    ``alpha`` = 1 is TGR's propagation; a smaller one keeps more of each tool's own vector."""
    if layers < 0:
        raise ValueError(f"layers must be >= 0, got {layers}")
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    adj = normalized_adjacency(edges, x.shape[0], direction)
    for _ in range(layers):
        x = (1 - alpha) * x + alpha * torch.sparse.mm(adj, x)  # [n, H]
    return x
