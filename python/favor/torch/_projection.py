"""The projection buffer that favor's modules carry, its redraw policy, and loading a
state_dict that lacks it (one from torch's nn.MultiheadAttention)."""
import torch

from .. import _core


def draw(m, d, kind, norms, seed):
    return torch.from_numpy(_core.Projection.draw(m, d, kind=kind, norms=norms,
                                                  seed=seed).matrix.copy())


class ProjectionMixin:
    """For modules with a `projection` ([m, head_dim] buffer, or Parameter when learned).

    feature_redraw_interval = n redraws W before every n-th training-mode forward call
    (the Performer's policy; None: never). Draw i uses seed + i, so a run is reproducible.
    """

    def _init_projection(self, features, head_dim, kind, norms, seed, learn,
                         feature_redraw_interval, device=None, dtype=None):
        if not isinstance(features, int) or features < 1:
            raise _core.Error(f"features: {features!r} must be an integer >= 1")
        if feature_redraw_interval is not None and (
                not isinstance(feature_redraw_interval, int) or feature_redraw_interval < 1):
            raise _core.Error(f"feature_redraw_interval: {feature_redraw_interval!r} must be "
                              "None or an integer >= 1")
        if learn and feature_redraw_interval is not None:
            raise _core.Error("feature_redraw_interval: a learned projection is not redrawn; "
                              "give one or the other")
        self.projection_kind, self.norms, self.seed = kind, norms, seed
        self.feature_redraw_interval = feature_redraw_interval
        self.redraws = 0
        self._calls = 0
        w = draw(features, head_dim, kind, norms, seed).to(device=device,
                                                           dtype=dtype or torch.float32)
        if learn:
            self.projection = torch.nn.Parameter(w)
        else:
            self.register_buffer("projection", w)

    @property
    def features(self):
        return self.projection.shape[0]

    @torch.no_grad()
    def redraw(self, seed=None):
        """Draws W anew (seed, or the next seed of this module's sequence) in place."""
        if seed is None:
            self.redraws += 1
            seed = self.seed + self.redraws
        w = draw(self.projection.shape[0], self.projection.shape[1], self.projection_kind,
                 self.norms, seed)
        self.projection.copy_(w)

    def fix_projection(self):
        """Stops redrawing: W stays as it is from now on (for fine-tuning and inference)."""
        self.feature_redraw_interval = None

    def _maybe_redraw(self):
        if self.training and self.feature_redraw_interval:
            if self._calls > 0 and self._calls % self.feature_redraw_interval == 0:
                self.redraw()
            self._calls += 1

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        # A state_dict from torch's nn.MultiheadAttention has no projection: keep ours.
        if prefix + "projection" in missing_keys:
            missing_keys.remove(prefix + "projection")
