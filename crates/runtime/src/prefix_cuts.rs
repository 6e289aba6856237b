//! Prompt cut points ([`PrefixCut`]) on the wire: in `GenerateRequest.prefix_cuts` to engines
//! that hash blocks themselves, and in the router's requests to a router replica.

use kvmesh_core::prefix::PrefixCut;
use kvmesh_proto::v1 as pb;

/// Prompt cut points as the wire carries them.
pub fn cuts_to_proto(cuts: &[PrefixCut]) -> Vec<pb::PrefixCut> {
    cuts.iter()
        .map(|cut| pb::PrefixCut {
            key_high: (cut.key >> 64) as u64,
            key_low: cut.key as u64,
            tokens: cut.tokens,
        })
        .collect()
}

/// Prompt cut points off the wire; cuts out of order are dropped, so a caller's mistake costs
/// only the reuse, never a wrong hash.
pub fn cuts_from_proto(cuts: &[pb::PrefixCut]) -> Vec<PrefixCut> {
    let mut last = 0;
    cuts.iter()
        .map(|cut| PrefixCut {
            key: u128::from(cut.key_high) << 64 | u128::from(cut.key_low),
            tokens: cut.tokens,
        })
        .take_while(|cut| {
            let ordered = cut.tokens >= last;
            last = cut.tokens;
            ordered
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_cuts_cross_the_wire_and_disordered_ones_are_dropped() {
        let cuts = vec![
            PrefixCut {
                key: u128::MAX - 5,
                tokens: 10,
            },
            PrefixCut {
                key: 7 << 70 | 3,
                tokens: 64,
            },
        ];
        assert_eq!(cuts_from_proto(&cuts_to_proto(&cuts)), cuts);
        let mut wire = cuts_to_proto(&cuts);
        wire.push(pb::PrefixCut {
            key_high: 0,
            key_low: 1,
            tokens: 5,
        });
        assert_eq!(cuts_from_proto(&wire), cuts);
    }
}
