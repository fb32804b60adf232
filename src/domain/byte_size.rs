//! Sizes as people read them, in the binary units the settings take (`20GiB`).

/// `bytes` in binary units with one decimal (`1.5 MiB`), for tables operators read.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units_with_one_decimal() {
        assert_eq!(human_bytes(123), "123.0 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(50 << 30), "50.0 GiB");
    }
}
