//! Without a CUDA driver the adapter says so, as a typed error, and nothing panics.

use guild_adapters_cuda::testing::report_skip;
use guild_adapters_cuda::{probe, CudaError, Driver, NoDevice};

#[test]
fn probing_without_a_driver_is_a_typed_no_device_error() {
    let err = match Driver::load() {
        Ok(driver) => {
            report_skip(
                "no_driver::probing_without_a_driver_is_a_typed_no_device_error",
                &format_args!("a CUDA driver is present (version {})", driver.version()),
            );
            return;
        }
        Err(e) => e,
    };
    // A machine with a driver but no usable device gets another NoDevice reason; this test is
    // about the machine with no driver at all, like CI.
    let CudaError::NoDevice(NoDevice::NoDriver(reason)) = &err else {
        report_skip(
            "no_driver::probing_without_a_driver_is_a_typed_no_device_error",
            &format_args!("the driver is there but unusable: {err}"),
        );
        return;
    };
    assert!(
        reason.contains("libcuda.so.1"),
        "the reason names the library: {reason}"
    );
    assert!(err.is_no_device());
    assert_eq!(
        err.to_string(),
        format!("no CUDA device: no CUDA driver ({reason})")
    );
    // The outcome is remembered, and every entry point says the same.
    assert_eq!(Driver::load().unwrap_err(), err);
    assert_eq!(probe().unwrap_err(), err);
}
