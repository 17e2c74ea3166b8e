"""gsim.diffusion: diffusion-based scene expansion and harmonization."""
from gsim.errors import InputError


def open_repairer(model=None, pretrained=None, controlnet=None, strength: float = 0.35, steps: int = 20,
                  paste: bool = False):
    """The repairer a command was given (an object with ``repair_image(rgb, alpha, depth, seed, mask)``):
    ``model``, a repair model directory (`gsim diffusion train`), ``pretrained``, a local Stable Diffusion
    inpainting or img2img directory with an optional depth ``controlnet`` (run at ``strength`` for ``steps``
    steps), or ``paste``: the log's real images pasted where they agree (`references.ReferencePaste`); None for
    none. A repair model runs on CUDA where there is one."""
    if sum(map(bool, (model, pretrained, paste))) > 1:
        raise InputError("give one repairer: a repair model (--repair), pretrained weights (--pretrained) or "
                         "--paste-references")
    if paste:
        from .references import ReferencePaste
        return ReferencePaste()
    if controlnet and not pretrained:
        raise InputError("--controlnet guides pretrained weights: it needs --pretrained")
    if model:
        from .repair import RepairModel
        return RepairModel.load(model, device="auto")
    if pretrained:
        from .pretrained import PretrainedRepair
        return PretrainedRepair.from_dir(pretrained, controlnet=controlnet, strength=strength, steps=steps)
    return None
