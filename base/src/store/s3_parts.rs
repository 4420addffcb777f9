//! How a file is cut into the parts of an S3 multipart upload.

/// S3's smallest part (all but the last).
pub const MIN_PART_SIZE: u64 = 5 << 20;
/// S3's most parts in one upload.
pub const MAX_PARTS: u64 = 10_000;

/// `(offset, length)` of every part of a `size`-byte file in parts of `part_size` (grown when
/// 10,000 parts would not hold the file). One part (or none, for an empty file) means: no
/// multipart upload.
#[cfg_attr(not(feature = "aws"), allow(dead_code))]
pub fn plan(size: u64, part_size: u64) -> Vec<(u64, u64)> {
    let part = part_size.max(MIN_PART_SIZE).max(size.div_ceil(MAX_PARTS));
    (0..size.div_ceil(part)).map(|i| (i * part, part.min(size - i * part))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_file_within_s3_limits() {
        const MIB: u64 = 1 << 20;
        assert!(plan(0, 64 * MIB).is_empty());
        assert_eq!(plan(64 * MIB, 64 * MIB), vec![(0, 64 * MIB)]);
        assert_eq!(plan(12 * MIB + 3, 5 * MIB), vec![(0, 5 * MIB), (5 * MIB, 5 * MIB), (10 * MIB, 2 * MIB + 3)]);
        // Below S3's minimum the parts are 5 MiB anyway.
        assert_eq!(plan(6 * MIB, MIB).len(), 2);
        // An 8 GiB snapshot in 64 MiB parts, and a file too big for 10,000 of them.
        for (size, part) in [(8 << 30, 64 * MIB), (MAX_PARTS * 64 * MIB + 1, 64 * MIB)] {
            let p = plan(size, part);
            assert!(p.len() as u64 <= MAX_PARTS, "{} parts", p.len());
            assert_eq!(p.iter().map(|(_, l)| l).sum::<u64>(), size);
            assert!(p.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0 && w[0].1 >= part));
        }
    }
}
