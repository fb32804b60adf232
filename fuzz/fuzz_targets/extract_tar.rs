//! Any archive, extracted as a layer or an upload, changes nothing outside its destination
//! (`strata::vmm::archive_fuzz` has the input format and the oracle).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(escape) = strata::vmm::archive_fuzz::check(data) {
        panic!("{escape}");
    }
});
