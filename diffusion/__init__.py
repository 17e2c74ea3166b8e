"""gsim.diffusion: diffusion-based scene expansion and harmonization."""
from gsim.errors import InputError


def open_repairer(model=None, pretrained=None, controlnet=None, strength: float = 0.35, steps: int = 20):
    """The repairer a command was given (an object with ``repair_image(rgb, alpha, depth, seed, mask)``):
    ``model``, a repair model directory (`gsim diffusion train`), or ``pretrained``, a local Stable Diffusion
    inpainting or img2img directory with an optional depth ``controlnet`` (run at ``strength`` for ``steps``
    steps); None for neither."""
    if model and pretrained:
        raise InputError("give a repair model (--repair) or pretrained weights (--pretrained), not both")
    if controlnet and not pretrained:
        raise InputError("--controlnet guides pretrained weights: it needs --pretrained")
    if model:
        from .repair import RepairModel
        return RepairModel.load(model)
    if pretrained:
        from .pretrained import PretrainedRepair
        return PretrainedRepair.from_dir(pretrained, controlnet=controlnet, strength=strength, steps=steps)
    return None
