"""trainkit.algorithms: training methods, each registered under ``trainkit.algorithms``.

Importing the package imports none of the methods: each name is imported from its module
on first use (PEP 562), so ``plugins.load("trainkit.algorithms", "ema")`` or
``from trainkit.algorithms.ema import EMA`` imports only that method and what it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainkit.core.plugins import lazy_exports

if TYPE_CHECKING:  # the same names, for type checkers (a test keeps the two equal)
    from trainkit.algorithms._passes import (
        STANDARD_PASSES,
        ComposableAlgorithm,
        warn_on_combined_loss_interpolation,
    )
    from trainkit.algorithms._surgery import (
        Policy,
        check_surgery_allowed,
        replace_modules,
    )
    from trainkit.algorithms.activation_checkpointing import (
        ActivationCheckpointing,
        ActivationCheckpointingConfig,
        apply_activation_checkpointing,
        selective_policy,
    )
    from trainkit.algorithms.alibi import (
        Alibi,
        AlibiAttention,
        AlibiBias,
        AlibiConfig,
        ZeroPositionEmbedding,
        alibi_bias,
        alibi_slopes,
        apply_alibi,
        scale_sequence_length,
    )
    from trainkit.algorithms.augmix import (
        AugmentAndMixTransform,
        AugMix,
        AugMixConfig,
        augmix_batch,
        augmix_image,
    )
    from trainkit.algorithms.batch_size_warmup import (
        BatchSizeWarmup,
        BatchSizeWarmupConfig,
        set_batch_size,
        warmup_batch_size,
    )
    from trainkit.algorithms.blurpool import (
        BlurConv2d,
        BlurMaxPool2d,
        BlurPool,
        BlurPoolConfig,
        apply_blurpool,
        blur_2d,
    )
    from trainkit.algorithms.channels_last import (
        ChannelsLast,
        ChannelsLastConfig,
        apply_channels_last,
    )
    from trainkit.algorithms.colout import (
        ColOut,
        ColOutConfig,
        ColOutTransform,
        colout_batch,
    )
    from trainkit.algorithms.cutmix import (
        CutMix,
        CutMixConfig,
        cutmix_batch,
        random_box,
    )
    from trainkit.algorithms.cutout import (
        CutOut,
        CutOutConfig,
        cutout_batch,
    )
    from trainkit.algorithms.early_stopper import (
        EarlyStopper,
        EarlyStopperConfig,
    )
    from trainkit.algorithms.ema import (
        EMA,
        EMAConfig,
        compute_ema,
    )
    from trainkit.algorithms.factorize import (
        Factorize,
        FactorizeConfig,
        FactorizedConv2d,
        FactorizedLinear,
        apply_factorize,
        low_rank_factors,
    )
    from trainkit.algorithms.float8_training import (
        Float8Training,
        Float8TrainingConfig,
        apply_float8_training,
        check_float8_device,
        float8_eligible,
    )
    from trainkit.algorithms.gated_linear_units import (
        GatedIntermediate,
        GatedLinearUnits,
        GatedLinearUnitsConfig,
        apply_gated_linear_units,
    )
    from trainkit.algorithms.ghost_batchnorm import (
        GhostBatchNorm,
        GhostBatchNormConfig,
        GhostBatchNormLayer,
        apply_ghost_batchnorm,
    )
    from trainkit.algorithms.gradient_clipping import (
        GradientClipping,
        GradientClippingConfig,
        apply_gradient_clipping,
    )
    from trainkit.algorithms.label_smoothing import (
        LabelSmoothing,
        LabelSmoothingConfig,
        smooth_labels,
    )
    from trainkit.algorithms.layer_freezing import (
        LayerFreezing,
        LayerFreezingConfig,
        freeze_layers,
        frozen_fraction,
    )
    from trainkit.algorithms.low_precision_groupnorm import (
        LowPrecisionGroupNorm,
        LowPrecisionGroupNormConfig,
        LPGroupNorm,
        apply_low_precision_groupnorm,
    )
    from trainkit.algorithms.low_precision_layernorm import (
        LowPrecisionLayerNorm,
        LowPrecisionLayerNormConfig,
        LPLayerNorm,
        apply_low_precision_layernorm,
    )
    from trainkit.algorithms.mixup import (
        MixUp,
        MixUpConfig,
        mixup_batch,
    )
    from trainkit.algorithms.progressive_resizing import (
        ProgressiveResizing,
        ProgressiveResizingConfig,
        resize_batch,
        resized_size,
        resizing_scale,
    )
    from trainkit.algorithms.qk_norm import (
        HeadRMSNorm,
        QKNorm,
        QKNormConfig,
        QKNormConv1D,
        QKNormLinear,
        apply_qk_norm,
    )
    from trainkit.algorithms.randaugment import (
        RandAugment,
        RandAugmentConfig,
        RandAugmentTransform,
        randaugment_batch,
        randaugment_image,
    )
    from trainkit.algorithms.relu_squared import (
        ReLUSquared,
        ReLUSquaredConfig,
        SquaredReLU,
        apply_relu_squared,
    )
    from trainkit.algorithms.rotary import (
        Rotary,
        RotaryConfig,
        RotaryGPT2Attention,
        apply_rotary,
        rotate,
    )
    from trainkit.algorithms.sam import (
        SAM,
        SAMConfig,
        sam_gradient,
    )
    from trainkit.algorithms.selective_backprop import (
        SelectiveBackprop,
        SelectiveBackpropConfig,
        per_sample_losses,
        select_high_loss,
        should_select,
    )
    from trainkit.algorithms.seq_length_warmup import (
        SeqLengthWarmup,
        SeqLengthWarmupConfig,
        set_batch_sequence_length,
        warmup_sequence_length,
    )
    from trainkit.algorithms.squeeze_excite import (
        SqueezeExcite,
        SqueezeExcite2d,
        SqueezeExciteConfig,
        SqueezeExciteConv2d,
        apply_squeeze_excite,
    )
    from trainkit.algorithms.stochastic_depth import (
        StochasticBlock,
        StochasticDepth,
        StochasticDepthConfig,
        apply_stochastic_depth,
    )
    from trainkit.algorithms.swa import (
        SWA,
        SWAConfig,
        recompute_batchnorm,
        update_average,
    )
    from trainkit.algorithms.threshold_stopper import (
        ThresholdStopper,
        ThresholdStopperConfig,
    )
    from trainkit.algorithms.weight_standardization import (
        WeightStandardization,
        WeightStandardizationConfig,
        apply_weight_standardization,
        standardize_weight,
    )

# The one list of the public names, by the module that defines each; `__all__` and the lazy
# imports are derived from it.
_MODULES: dict[str, tuple[str, ...]] = {
    "_passes": ("ComposableAlgorithm", "STANDARD_PASSES", "warn_on_combined_loss_interpolation"),
    "_surgery": ("check_surgery_allowed", "Policy", "replace_modules"),
    "activation_checkpointing": (
        "ActivationCheckpointing",
        "ActivationCheckpointingConfig",
        "apply_activation_checkpointing",
        "selective_policy",
    ),
    "alibi": (
        "Alibi",
        "alibi_bias",
        "alibi_slopes",
        "AlibiAttention",
        "AlibiBias",
        "AlibiConfig",
        "apply_alibi",
        "scale_sequence_length",
        "ZeroPositionEmbedding",
    ),
    "augmix": ("AugMix", "augmix_batch", "augmix_image", "AugMixConfig", "AugmentAndMixTransform"),
    "batch_size_warmup": (
        "BatchSizeWarmup",
        "BatchSizeWarmupConfig",
        "set_batch_size",
        "warmup_batch_size",
    ),
    "blurpool": (
        "apply_blurpool",
        "blur_2d",
        "BlurConv2d",
        "BlurMaxPool2d",
        "BlurPool",
        "BlurPoolConfig",
    ),
    "channels_last": ("apply_channels_last", "ChannelsLast", "ChannelsLastConfig"),
    "colout": ("ColOut", "colout_batch", "ColOutConfig", "ColOutTransform"),
    "cutmix": ("CutMix", "cutmix_batch", "CutMixConfig", "random_box"),
    "cutout": ("CutOut", "cutout_batch", "CutOutConfig"),
    "early_stopper": ("EarlyStopper", "EarlyStopperConfig"),
    "ema": ("compute_ema", "EMA", "EMAConfig"),
    "factorize": (
        "apply_factorize",
        "Factorize",
        "FactorizeConfig",
        "FactorizedConv2d",
        "FactorizedLinear",
        "low_rank_factors",
    ),
    "float8_training": (
        "apply_float8_training",
        "check_float8_device",
        "Float8Training",
        "Float8TrainingConfig",
        "float8_eligible",
    ),
    "gated_linear_units": (
        "apply_gated_linear_units",
        "GatedIntermediate",
        "GatedLinearUnits",
        "GatedLinearUnitsConfig",
    ),
    "ghost_batchnorm": (
        "apply_ghost_batchnorm",
        "GhostBatchNorm",
        "GhostBatchNormConfig",
        "GhostBatchNormLayer",
    ),
    "gradient_clipping": ("apply_gradient_clipping", "GradientClipping", "GradientClippingConfig"),
    "label_smoothing": ("LabelSmoothing", "LabelSmoothingConfig", "smooth_labels"),
    "layer_freezing": ("freeze_layers", "frozen_fraction", "LayerFreezing", "LayerFreezingConfig"),
    "low_precision_groupnorm": (
        "apply_low_precision_groupnorm",
        "LowPrecisionGroupNorm",
        "LowPrecisionGroupNormConfig",
        "LPGroupNorm",
    ),
    "low_precision_layernorm": (
        "apply_low_precision_layernorm",
        "LowPrecisionLayerNorm",
        "LowPrecisionLayerNormConfig",
        "LPLayerNorm",
    ),
    "mixup": ("MixUp", "mixup_batch", "MixUpConfig"),
    "progressive_resizing": (
        "ProgressiveResizing",
        "ProgressiveResizingConfig",
        "resize_batch",
        "resized_size",
        "resizing_scale",
    ),
    "qk_norm": (
        "apply_qk_norm",
        "HeadRMSNorm",
        "QKNorm",
        "QKNormConfig",
        "QKNormConv1D",
        "QKNormLinear",
    ),
    "randaugment": (
        "RandAugment",
        "randaugment_batch",
        "randaugment_image",
        "RandAugmentConfig",
        "RandAugmentTransform",
    ),
    "relu_squared": ("apply_relu_squared", "ReLUSquared", "ReLUSquaredConfig", "SquaredReLU"),
    "rotary": ("apply_rotary", "rotate", "Rotary", "RotaryConfig", "RotaryGPT2Attention"),
    "sam": ("SAM", "sam_gradient", "SAMConfig"),
    "selective_backprop": (
        "per_sample_losses",
        "select_high_loss",
        "SelectiveBackprop",
        "SelectiveBackpropConfig",
        "should_select",
    ),
    "seq_length_warmup": (
        "SeqLengthWarmup",
        "SeqLengthWarmupConfig",
        "set_batch_sequence_length",
        "warmup_sequence_length",
    ),
    "squeeze_excite": (
        "apply_squeeze_excite",
        "SqueezeExcite",
        "SqueezeExcite2d",
        "SqueezeExciteConfig",
        "SqueezeExciteConv2d",
    ),
    "stochastic_depth": (
        "apply_stochastic_depth",
        "StochasticBlock",
        "StochasticDepth",
        "StochasticDepthConfig",
    ),
    "swa": ("recompute_batchnorm", "SWA", "SWAConfig", "update_average"),
    "threshold_stopper": ("ThresholdStopper", "ThresholdStopperConfig"),
    "weight_standardization": (
        "apply_weight_standardization",
        "standardize_weight",
        "WeightStandardization",
        "WeightStandardizationConfig",
    ),
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_MODULE_OF)


__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)
