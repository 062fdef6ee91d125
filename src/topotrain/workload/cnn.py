"""Image CNNs built layer by layer from their architecture: ResNet-50/101, VGG-16, AlexNet, Inception-v3.

Architectures as in torchvision (layer names follow its module names):

* ResNet (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016, Table 1), bottleneck
  blocks; ``variant="v1.5"`` (torchvision, NVIDIA's "ResNet-50 v1.5") puts the stride on the 3×3 conv,
  ``"v1"`` (the paper) on the first 1×1 conv.
* VGG-16 (Simonyan & Zisserman, ICLR 2015, configuration D), without batch norm.
* AlexNet (Krizhevsky et al. 2012) in torchvision's single-tower variant ("One weird trick", Krizhevsky
  2014: 64-192-384-256-256 channels).
* Inception-v3 (Szegedy et al., "Rethinking the Inception Architecture", CVPR 2016), 299×299 input,
  with the auxiliary classifier by default (it runs in training).

Counting: a conv computes ``2·Cin·Cout·kh·kw·Hout·Wout/groups`` FLOPs (a multiply-add is 2 FLOPs; the
published "GFLOPs" of these nets count multiply-adds, i.e. half our number). Conv output size is
``floor((H + 2p − k)/s) + 1``. BatchNorm forward ≈ 8 FLOPs per element (mean 1, variance 3, normalize 2,
scale and shift 2), ReLU 1, max/avg pooling ``k²`` per output element. See :mod:`.layer` for the
backward, bytes and activation conventions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topotrain.util.errors import ConfigError
from topotrain.workload.layer import Layer, LayerKind, Model

_BN_FLOPS_PER_ELEMENT = 8.0
_INDEX_BYTES = 8  # PyTorch max-pool indices are int64


@dataclass(frozen=True)
class _T:
    """A feature map of one sample: channels × height × width, with an identity for stash accounting."""

    c: int
    h: int
    w: int
    uid: int

    @property
    def numel(self) -> int:
        return self.c * self.h * self.w


def _out_size(size: int, k: int, s: int, p: int, where: str, model: str, image_size: int) -> int:
    out = (size + 2 * p - k) // s + 1
    if out <= 0:
        raise ConfigError(
            "image_size",
            f"{image_size} px is too small for {model} (feature map vanishes at {where})",
            "use a larger image_size, e.g. 224 (299 for inception-v3)",
        )
    return out


class _Builder:
    """Accumulates layers; tracks which tensors are already stashed so that none is counted twice."""

    def __init__(self, model: str, image_size: int, dtype: int) -> None:
        self.model = model
        self.image_size = image_size
        self.dtype = dtype
        self.layers: list[Layer] = []
        self._stashed: set[int] = set()
        self._uid = 0
        self.block = 0

    def tensor(self, c: int, h: int, w: int) -> _T:
        self._uid += 1
        return _T(c, h, w, self._uid)

    def _stash(self, t: _T) -> float:
        if t.uid in self._stashed:
            return 0.0
        self._stashed.add(t.uid)
        return float(t.numel * self.dtype)

    def _add(self, **kw: Any) -> None:
        kw.setdefault("block", self.block)
        self.layers.append(Layer(**kw))

    def conv(
        self,
        name: str,
        x: _T,
        cout: int,
        k: int | tuple[int, int],
        stride: int = 1,
        pad: int | tuple[int, int] = 0,
        groups: int = 1,
        bias: bool = False,
        input_grad: bool = True,
    ) -> _T:
        kh, kw = (k, k) if isinstance(k, int) else k
        ph, pw = (pad, pad) if isinstance(pad, int) else pad
        ho = _out_size(x.h, kh, stride, ph, name, self.model, self.image_size)
        wo = _out_size(x.w, kw, stride, pw, name, self.model, self.image_size)
        y = self.tensor(cout, ho, wo)
        m, n, kk = ho * wo, cout // groups, (x.c // groups) * kh * kw
        params = cout * kk + (cout if bias else 0)
        fwd = 2.0 * m * n * kk * groups + (y.numel if bias else 0)
        d = self.dtype
        bwd_bytes = d * (2 * y.numel + 2 * params + x.numel + (x.numel if input_grad else 0))
        self._add(
            name=name,
            kind=LayerKind.CONV,
            fwd_flops=fwd,
            bwd_flops=fwd * (2.0 if input_grad else 1.0),
            fwd_bytes=float(d * (x.numel + y.numel + params)),
            bwd_bytes=float(bwd_bytes),
            param_count=params,
            activation_bytes=self._stash(x),
            output_bytes=float(d * y.numel),
            param_bytes=float(d * params),
            gemm_shape=(m, n, kk),
            gemm_count=groups,
        )
        return y

    def bn(self, name: str, x: _T) -> _T:
        y = self.tensor(x.c, x.h, x.w)
        n, d, params = x.numel, self.dtype, 2 * x.c
        fwd = _BN_FLOPS_PER_ELEMENT * n
        self._add(
            name=name,
            kind=LayerKind.NORM,
            fwd_flops=fwd,
            bwd_flops=2.0 * fwd,
            fwd_bytes=float(d * (3 * n + params)),
            bwd_bytes=float(d * (3 * n + 2 * params)),
            param_count=params,
            activation_bytes=self._stash(x),
            output_bytes=float(d * n),
            param_bytes=float(d * params),
        )
        return y

    def relu(self, name: str, x: _T) -> _T:
        y = self.tensor(x.c, x.h, x.w)
        n, d = x.numel, self.dtype
        self._add(
            name=name,
            kind=LayerKind.ELEMENTWISE,
            fwd_flops=float(n),
            bwd_flops=float(n),
            fwd_bytes=float(2 * d * n),
            bwd_bytes=float(3 * d * n),
            activation_bytes=self._stash(y),
            output_bytes=float(d * n),
        )
        return y

    def conv_bn_relu(
        self,
        name: str,
        x: _T,
        cout: int,
        k: int | tuple[int, int],
        stride: int = 1,
        pad: int | tuple[int, int] = 0,
        input_grad: bool = True,
    ) -> _T:
        """torchvision's ``BasicConv2d`` (Inception): conv without bias, BN, ReLU."""
        y = self.conv(f"{name}.conv", x, cout, k, stride, pad, input_grad=input_grad)
        return self.relu(f"{name}.relu", self.bn(f"{name}.bn", y))

    def pool(self, name: str, x: _T, k: int, stride: int, pad: int = 0, kind: str = "max") -> _T:
        ho = _out_size(x.h, k, stride, pad, name, self.model, self.image_size)
        wo = _out_size(x.w, k, stride, pad, name, self.model, self.image_size)
        y = self.tensor(x.c, ho, wo)
        d = self.dtype
        idx = _INDEX_BYTES * y.numel if kind == "max" else 0
        stash = (self._stash(x) + idx) if kind == "max" else 0.0
        fwd = float(k * k * y.numel)
        self._add(
            name=name,
            kind=LayerKind.POOL,
            fwd_flops=fwd,
            bwd_flops=fwd,
            fwd_bytes=float(d * (x.numel + y.numel) + idx),
            bwd_bytes=float(d * (x.numel + y.numel) + idx),
            activation_bytes=stash,
            output_bytes=float(d * y.numel),
        )
        return y

    def adaptive_avgpool(self, name: str, x: _T, out_h: int, out_w: int) -> _T:
        y = self.tensor(x.c, out_h, out_w)
        d = self.dtype
        fwd = float(max(x.numel, y.numel))
        self._add(
            name=name,
            kind=LayerKind.POOL,
            fwd_flops=fwd,
            bwd_flops=fwd,
            fwd_bytes=float(d * (x.numel + y.numel)),
            bwd_bytes=float(d * (x.numel + y.numel)),
            output_bytes=float(d * y.numel),
        )
        return y

    def linear(self, name: str, x: _T, nout: int, bias: bool = True) -> _T:
        y = self.tensor(nout, 1, 1)
        k, d = x.numel, self.dtype
        params = nout * k + (nout if bias else 0)
        fwd = 2.0 * nout * k + (nout if bias else 0)
        self._add(
            name=name,
            kind=LayerKind.LINEAR,
            fwd_flops=fwd,
            bwd_flops=2.0 * fwd,
            fwd_bytes=float(d * (k + nout + params)),
            bwd_bytes=float(d * (2 * k + 2 * nout + 2 * params)),
            param_count=params,
            activation_bytes=self._stash(x),
            output_bytes=float(d * nout),
            param_bytes=float(d * params),
            gemm_shape=(1, nout, k),
        )
        return y

    def dropout(self, name: str, x: _T) -> _T:
        y = self.tensor(x.c, x.h, x.w)
        n, d = x.numel, self.dtype
        self._add(
            name=name,
            kind=LayerKind.DROPOUT,
            fwd_flops=float(n),
            bwd_flops=float(n),
            fwd_bytes=float(2 * d * n + n),
            bwd_bytes=float(2 * d * n + n),
            activation_bytes=float(n),
            output_bytes=float(d * n),
        )
        return y

    def add(self, name: str, a: _T, b: _T) -> _T:
        y = self.tensor(a.c, a.h, a.w)
        n, d = a.numel, self.dtype
        self._add(
            name=name,
            kind=LayerKind.ELEMENTWISE,
            fwd_flops=float(n),
            bwd_flops=float(n),
            fwd_bytes=float(3 * d * n),
            bwd_bytes=float(3 * d * n),
            output_bytes=float(d * n),
        )
        return y

    def concat(self, name: str, xs: list[_T]) -> _T:
        y = self.tensor(sum(t.c for t in xs), xs[0].h, xs[0].w)
        n, d = y.numel, self.dtype
        self._add(
            name=name,
            kind=LayerKind.CONCAT,
            fwd_flops=0.0,
            bwd_flops=0.0,
            fwd_bytes=float(2 * d * n),
            bwd_bytes=float(2 * d * n),
            output_bytes=float(d * n),
        )
        return y

    def loss(self, name: str, x: _T) -> None:
        """Softmax cross-entropy over the classes (≈ 5 FLOPs per logit: max, subtract, exp, sum, log)."""
        n, d = x.numel, self.dtype
        self._add(
            name=name,
            kind=LayerKind.LOSS,
            fwd_flops=5.0 * n,
            bwd_flops=2.0 * n,
            fwd_bytes=float(2 * d * n),
            bwd_bytes=float(2 * d * n),
            activation_bytes=float(d * n),
            output_bytes=4.0,
            block=-1,
        )

    def finish(self, **meta: Any) -> Model:
        return Model(
            name=self.model,
            layers=tuple(self.layers),
            dtype=self.dtype,
            sample_kind="image",
            image_size=self.image_size,
            **meta,
        )


def _check_int(value: object, field: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            field,
            f"must be an integer ≥ {minimum}, got {value!r}",
            f"give e.g. {field}=224" if field == "image_size" else f"give an integer ≥ {minimum}",
        )
    return value


def _start(name: str, image_size: int, num_classes: int, dtype: int) -> tuple[_Builder, _T]:
    _check_int(image_size, "image_size")
    _check_int(num_classes, "num_classes")
    if dtype not in (1, 2, 4, 8):
        raise ConfigError(
            "dtype", f"must be 1, 2, 4 or 8 bytes per element, got {dtype!r}", "use 2 for fp16/bf16"
        )
    b = _Builder(name, image_size, dtype)
    return b, b.tensor(3, image_size, image_size)


def _resnet(
    name: str, blocks: tuple[int, int, int, int], image_size: int, num_classes: int, dtype: int, variant: str
) -> Model:
    if variant not in ("v1", "v1.5"):
        raise ConfigError(
            "variant", f"unknown ResNet variant {variant!r}", "use 'v1.5' (torchvision) or 'v1'"
        )
    b, x = _start(name, image_size, num_classes, dtype)
    x = b.conv("conv1", x, 64, 7, 2, 3, input_grad=False)
    x = b.relu("relu", b.bn("bn1", x))
    x = b.pool("maxpool", x, 3, 2, 1)
    for stage, (count, width) in enumerate(zip(blocks, (64, 128, 256, 512), strict=True), start=1):
        for i in range(count):
            b.block += 1
            stride = 2 if (i == 0 and stage > 1) else 1
            s1, s3 = (stride, 1) if variant == "v1" else (1, stride)
            p = f"layer{stage}.{i}"
            identity = x
            y = b.relu(f"{p}.relu1", b.bn(f"{p}.bn1", b.conv(f"{p}.conv1", x, width, 1, s1)))
            y = b.relu(f"{p}.relu2", b.bn(f"{p}.bn2", b.conv(f"{p}.conv2", y, width, 3, s3, 1)))
            y = b.bn(f"{p}.bn3", b.conv(f"{p}.conv3", y, 4 * width, 1))
            if i == 0:
                identity = b.bn(f"{p}.downsample.1", b.conv(f"{p}.downsample.0", x, 4 * width, 1, stride))
            x = b.relu(f"{p}.relu3", b.add(f"{p}.add", y, identity))
    b.block = -1
    x = b.adaptive_avgpool("avgpool", x, 1, 1)
    x = b.linear("fc", x, num_classes)
    b.loss("loss", x)
    return b.finish()


def resnet50(image_size: int = 224, num_classes: int = 1000, dtype: int = 2, variant: str = "v1.5") -> Model:
    """ResNet-50 (He et al. 2016): 25,557,032 parameters, 4.09 G multiply-adds at 224² (v1.5)."""
    return _resnet("resnet50", (3, 4, 6, 3), image_size, num_classes, dtype, variant)


def resnet101(image_size: int = 224, num_classes: int = 1000, dtype: int = 2, variant: str = "v1.5") -> Model:
    """ResNet-101 (He et al. 2016): 44,549,160 parameters, 7.80 G multiply-adds at 224² (v1.5)."""
    return _resnet("resnet101", (3, 4, 23, 3), image_size, num_classes, dtype, variant)


def vgg16(image_size: int = 224, num_classes: int = 1000, dtype: int = 2) -> Model:
    """VGG-16 (Simonyan & Zisserman 2015, configuration D): 138,357,544 parameters, 15.5 G MACs at 224²."""
    b, x = _start("vgg16", image_size, num_classes, dtype)
    cfg: list[int | str] = [
        64,
        64,
        "M",
        128,
        128,
        "M",
        256,
        256,
        256,
        "M",
        512,
        512,
        512,
        "M",
        512,
        512,
        512,
        "M",
    ]
    idx = 0
    for v in cfg:
        if v == "M":
            x = b.pool(f"features.{idx}", x, 2, 2)
            idx += 1
            b.block += 1
        else:
            x = b.conv(f"features.{idx}", x, int(v), 3, 1, 1, bias=True, input_grad=idx > 0)
            x = b.relu(f"features.{idx + 1}", x)
            idx += 2
    b.block = -1
    x = b.adaptive_avgpool("avgpool", x, 7, 7)
    x = b.relu("classifier.1", b.linear("classifier.0", x, 4096))
    x = b.dropout("classifier.2", x)
    x = b.relu("classifier.4", b.linear("classifier.3", x, 4096))
    x = b.dropout("classifier.5", x)
    x = b.linear("classifier.6", x, num_classes)
    b.loss("loss", x)
    return b.finish()


def alexnet(image_size: int = 224, num_classes: int = 1000, dtype: int = 2) -> Model:
    """AlexNet, torchvision's single-tower variant: 61,100,840 parameters, 0.71 G MACs at 224²."""
    b, x = _start("alexnet", image_size, num_classes, dtype)
    x = b.relu("features.1", b.conv("features.0", x, 64, 11, 4, 2, bias=True, input_grad=False))
    x = b.pool("features.2", x, 3, 2)
    b.block += 1
    x = b.relu("features.4", b.conv("features.3", x, 192, 5, 1, 2, bias=True))
    x = b.pool("features.5", x, 3, 2)
    b.block += 1
    x = b.relu("features.7", b.conv("features.6", x, 384, 3, 1, 1, bias=True))
    x = b.relu("features.9", b.conv("features.8", x, 256, 3, 1, 1, bias=True))
    x = b.relu("features.11", b.conv("features.10", x, 256, 3, 1, 1, bias=True))
    x = b.pool("features.12", x, 3, 2)
    b.block = -1
    x = b.adaptive_avgpool("avgpool", x, 6, 6)
    x = b.dropout("classifier.0", x)
    x = b.relu("classifier.2", b.linear("classifier.1", x, 4096))
    x = b.dropout("classifier.3", x)
    x = b.relu("classifier.5", b.linear("classifier.4", x, 4096))
    x = b.linear("classifier.6", x, num_classes)
    b.loss("loss", x)
    return b.finish()


def _inception_a(b: _Builder, p: str, x: _T, pool_features: int) -> _T:
    b1 = b.conv_bn_relu(f"{p}.branch1x1", x, 64, 1)
    b5 = b.conv_bn_relu(f"{p}.branch5x5_1", x, 48, 1)
    b5 = b.conv_bn_relu(f"{p}.branch5x5_2", b5, 64, 5, pad=2)
    b3 = b.conv_bn_relu(f"{p}.branch3x3dbl_1", x, 64, 1)
    b3 = b.conv_bn_relu(f"{p}.branch3x3dbl_2", b3, 96, 3, pad=1)
    b3 = b.conv_bn_relu(f"{p}.branch3x3dbl_3", b3, 96, 3, pad=1)
    bp = b.pool(f"{p}.avg_pool", x, 3, 1, 1, kind="avg")
    bp = b.conv_bn_relu(f"{p}.branch_pool", bp, pool_features, 1)
    return b.concat(f"{p}.cat", [b1, b5, b3, bp])


def _inception_b(b: _Builder, p: str, x: _T) -> _T:
    b3 = b.conv_bn_relu(f"{p}.branch3x3", x, 384, 3, 2)
    bd = b.conv_bn_relu(f"{p}.branch3x3dbl_1", x, 64, 1)
    bd = b.conv_bn_relu(f"{p}.branch3x3dbl_2", bd, 96, 3, pad=1)
    bd = b.conv_bn_relu(f"{p}.branch3x3dbl_3", bd, 96, 3, 2)
    bp = b.pool(f"{p}.max_pool", x, 3, 2)
    return b.concat(f"{p}.cat", [b3, bd, bp])


def _inception_c(b: _Builder, p: str, x: _T, c7: int) -> _T:
    b1 = b.conv_bn_relu(f"{p}.branch1x1", x, 192, 1)
    b7 = b.conv_bn_relu(f"{p}.branch7x7_1", x, c7, 1)
    b7 = b.conv_bn_relu(f"{p}.branch7x7_2", b7, c7, (1, 7), pad=(0, 3))
    b7 = b.conv_bn_relu(f"{p}.branch7x7_3", b7, 192, (7, 1), pad=(3, 0))
    bd = b.conv_bn_relu(f"{p}.branch7x7dbl_1", x, c7, 1)
    bd = b.conv_bn_relu(f"{p}.branch7x7dbl_2", bd, c7, (7, 1), pad=(3, 0))
    bd = b.conv_bn_relu(f"{p}.branch7x7dbl_3", bd, c7, (1, 7), pad=(0, 3))
    bd = b.conv_bn_relu(f"{p}.branch7x7dbl_4", bd, c7, (7, 1), pad=(3, 0))
    bd = b.conv_bn_relu(f"{p}.branch7x7dbl_5", bd, 192, (1, 7), pad=(0, 3))
    bp = b.pool(f"{p}.avg_pool", x, 3, 1, 1, kind="avg")
    bp = b.conv_bn_relu(f"{p}.branch_pool", bp, 192, 1)
    return b.concat(f"{p}.cat", [b1, b7, bd, bp])


def _inception_d(b: _Builder, p: str, x: _T) -> _T:
    b3 = b.conv_bn_relu(f"{p}.branch3x3_1", x, 192, 1)
    b3 = b.conv_bn_relu(f"{p}.branch3x3_2", b3, 320, 3, 2)
    b7 = b.conv_bn_relu(f"{p}.branch7x7x3_1", x, 192, 1)
    b7 = b.conv_bn_relu(f"{p}.branch7x7x3_2", b7, 192, (1, 7), pad=(0, 3))
    b7 = b.conv_bn_relu(f"{p}.branch7x7x3_3", b7, 192, (7, 1), pad=(3, 0))
    b7 = b.conv_bn_relu(f"{p}.branch7x7x3_4", b7, 192, 3, 2)
    bp = b.pool(f"{p}.max_pool", x, 3, 2)
    return b.concat(f"{p}.cat", [b3, b7, bp])


def _inception_e(b: _Builder, p: str, x: _T) -> _T:
    b1 = b.conv_bn_relu(f"{p}.branch1x1", x, 320, 1)
    b3 = b.conv_bn_relu(f"{p}.branch3x3_1", x, 384, 1)
    b3a = b.conv_bn_relu(f"{p}.branch3x3_2a", b3, 384, (1, 3), pad=(0, 1))
    b3b = b.conv_bn_relu(f"{p}.branch3x3_2b", b3, 384, (3, 1), pad=(1, 0))
    bd = b.conv_bn_relu(f"{p}.branch3x3dbl_1", x, 448, 1)
    bd = b.conv_bn_relu(f"{p}.branch3x3dbl_2", bd, 384, 3, pad=1)
    bda = b.conv_bn_relu(f"{p}.branch3x3dbl_3a", bd, 384, (1, 3), pad=(0, 1))
    bdb = b.conv_bn_relu(f"{p}.branch3x3dbl_3b", bd, 384, (3, 1), pad=(1, 0))
    bp = b.pool(f"{p}.avg_pool", x, 3, 1, 1, kind="avg")
    bp = b.conv_bn_relu(f"{p}.branch_pool", bp, 192, 1)
    return b.concat(f"{p}.cat", [b1, b3a, b3b, bda, bdb, bp])


def inception_v3(
    image_size: int = 299, num_classes: int = 1000, dtype: int = 2, aux_logits: bool = True
) -> Model:
    """Inception-v3 (Szegedy et al. 2016) as torchvision: 27,161,264 parameters with the auxiliary
    classifier (23,834,568 without), 5.71 G MACs at 299² (main tower)."""
    b, x = _start("inception-v3", image_size, num_classes, dtype)
    x = b.conv_bn_relu("Conv2d_1a_3x3", x, 32, 3, 2, input_grad=False)
    x = b.conv_bn_relu("Conv2d_2a_3x3", x, 32, 3)
    x = b.conv_bn_relu("Conv2d_2b_3x3", x, 64, 3, pad=1)
    x = b.pool("maxpool1", x, 3, 2)
    x = b.conv_bn_relu("Conv2d_3b_1x1", x, 80, 1)
    x = b.conv_bn_relu("Conv2d_4a_3x3", x, 192, 3)
    x = b.pool("maxpool2", x, 3, 2)
    for p, pf in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):
        b.block += 1
        x = _inception_a(b, p, x, pf)
    b.block += 1
    x = _inception_b(b, "Mixed_6a", x)
    for p, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        b.block += 1
        x = _inception_c(b, p, x, c7)
    if aux_logits:
        a = b.pool("AuxLogits.avg_pool", x, 5, 3, kind="avg")
        a = b.conv_bn_relu("AuxLogits.conv0", a, 128, 1)
        a = b.conv_bn_relu("AuxLogits.conv1", a, 768, 5)
        a = b.adaptive_avgpool("AuxLogits.adaptive_avg_pool", a, 1, 1)
        a = b.linear("AuxLogits.fc", a, num_classes)
        b.loss("AuxLogits.loss", a)
    b.block += 1
    x = _inception_d(b, "Mixed_7a", x)
    for p in ("Mixed_7b", "Mixed_7c"):
        b.block += 1
        x = _inception_e(b, p, x)
    b.block = -1
    x = b.adaptive_avgpool("avgpool", x, 1, 1)
    x = b.dropout("dropout", x)
    x = b.linear("fc", x, num_classes)
    b.loss("loss", x)
    return b.finish()
