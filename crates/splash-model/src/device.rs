//! The device seam. A model is defined once: its weights load into host memory in their
//! stored format ([`qwen35::Weights`], [`dflash::DraftWeights`]) and the types the engine
//! holds ([`Qwen35`], [`SequenceState`], [`DFlashDraft`], [`DraftContext`]) do everything
//! that does not depend on where the arithmetic runs: validation, positions, checkpoints,
//! images. The arithmetic and the per-sequence buffers belong to a device, behind the traits
//! in each model's `device.rs` (`qwen35/device.rs`: `TextDevice`, `DeviceState`;
//! `dflash/device.rs`: `DraftDevice`, `DeviceContext`). The CPU device is the exact reference; the CUDA device (feature `cuda`) copies the
//! weights to the GPU once and keeps each sequence's state there. A device is chosen once,
//! when the model is placed (`Qwen35::to_gpu`); nothing else asks which one runs.
//!
//! States and contexts are made by the device that runs them; handing one to another device
//! is an error ([`ModelError::WrongDevice`]), not a panic.
//!
//! [`Qwen35`]: crate::Qwen35
//! [`SequenceState`]: crate::SequenceState
//! [`DFlashDraft`]: crate::DFlashDraft
//! [`DraftContext`]: crate::DraftContext
//! [`qwen35::Weights`]: crate::qwen35::Weights
//! [`dflash::DraftWeights`]: crate::dflash::DraftWeights

use std::any::Any;

use crate::error::ModelError;

/// `state` as the concrete type of the device asking, or the error that says it is not.
pub(crate) fn downcast<'a, T: 'static>(
    any: &'a mut dyn Any,
    device: &str,
) -> Result<&'a mut T, ModelError> {
    any.downcast_mut::<T>()
        .ok_or_else(|| ModelError::WrongDevice(device.to_string()))
}
