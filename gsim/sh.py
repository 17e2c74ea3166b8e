"""Real spherical harmonics in the 3DGS basis and signs: the view-dependent colours of every renderer and the
rotation of an actor's colours (gsim.surfels). Plain arithmetic on numpy arrays or torch tensors alike."""
from __future__ import annotations

SH_C = (0.28209479177387814, 0.4886025119029199,
        (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792,
         0.5462742152960396),
        (-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
         -0.4570457994644658, 1.445305721320277, -0.5900435899266435))
SH_C0 = SH_C[0]  # rgb = SH_C0 * dc + 0.5 (the degree-0 term)


def eval_sh(sh, dirs):
    """Real SH coefficients (N,K,3), K in {1, 4, 9, 16}, evaluated at unit directions (N,3) -> (N,3) (numpy arrays or
    torch tensors)."""
    k = sh.shape[1]
    out = SH_C[0] * sh[:, 0]
    if k == 1:
        return out
    x, y, z = dirs[:, 0:1], dirs[:, 1:2], dirs[:, 2:3]
    out = out - SH_C[1] * y * sh[:, 1] + SH_C[1] * z * sh[:, 2] - SH_C[1] * x * sh[:, 3]
    if k == 4:
        return out
    xx, yy, zz, xy, yz, xz = x * x, y * y, z * z, x * y, y * z, x * z
    c2 = SH_C[2]
    out = (out + c2[0] * xy * sh[:, 4] + c2[1] * yz * sh[:, 5] + c2[2] * (2 * zz - xx - yy) * sh[:, 6]
           + c2[3] * xz * sh[:, 7] + c2[4] * (xx - yy) * sh[:, 8])
    if k == 9:
        return out
    c3 = SH_C[3]
    return (out + c3[0] * y * (3 * xx - yy) * sh[:, 9] + c3[1] * xy * z * sh[:, 10]
            + c3[2] * y * (4 * zz - xx - yy) * sh[:, 11] + c3[3] * z * (2 * zz - 3 * xx - 3 * yy) * sh[:, 12]
            + c3[4] * x * (4 * zz - xx - yy) * sh[:, 13] + c3[5] * z * (xx - yy) * sh[:, 14]
            + c3[6] * x * (xx - 3 * yy) * sh[:, 15])
