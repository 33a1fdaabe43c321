//! `doctor`'s NVLink line: a GPU with NVLink whose link is down is a failure. On an HGX/DGX
//! board every link of every GPU trains at boot; one that did not leaves the GPU's share of
//! every all-reduce on fewer links (a slow rank for the whole job), and is a fault of the GPU,
//! the NVSwitch or the fabric manager. Nodes without NVLink get no line.

use super::checks::{Check, GpuFacts, Status};

/// The NVLink line, or none when no GPU reports NVLink.
pub fn nvlink_check(live: &[&GpuFacts]) -> Option<Check> {
    let with: Vec<(u32, &crate::telemetry::nvlink::NvLinkSample)> = live
        .iter()
        .filter_map(|g| g.nvlink.as_ref().map(|n| (g.index, n)))
        .collect();
    if with.is_empty() {
        return None;
    }
    let down: Vec<String> = with
        .iter()
        .filter_map(|(i, n)| {
            let d = n.down();
            let names = d.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            let word = if d.len() == 1 { "link" } else { "links" };
            (!d.is_empty()).then(|| {
                format!(
                    "GPU {i}: NVLink {word} {names} down ({} of {} up)",
                    n.links_up, n.links
                )
            })
        })
        .collect();
    let detail = if down.is_empty() {
        let total: u32 = with.iter().map(|(_, n)| n.links).sum();
        format!("all {total} NVLinks up on {} GPUs", with.len())
    } else {
        let first = down.first().map_or(0, |_| {
            with.iter()
                .find(|(_, n)| !n.down().is_empty())
                .map_or(0, |(i, _)| *i)
        });
        format!(
            "{}: the GPU's all-reduce traffic crowds onto its other links and slows every rank of \
             the job; check `nvidia-smi nvlink -s -i {first}` and the fabric manager (`systemctl \
             status nvidia-fabricmanager`), reset the GPU when it is idle (`nvidia-smi -r -i \
             {first}`); a link that stays down needs the board serviced",
            down.join("; ")
        )
    };
    let status = if down.is_empty() {
        Status::Ok
    } else {
        Status::Fail
    };
    Some(Check {
        name: "nvlink".into(),
        status,
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::nvlink::{LinkNow, NvLinkSample};

    fn gpu(index: u32, down: &[u32]) -> GpuFacts {
        let per_link: Vec<LinkNow> = (0..18)
            .map(|l| LinkNow {
                up: Some(!down.contains(&l)),
                ..LinkNow::default()
            })
            .collect();
        GpuFacts {
            index,
            nvlink: Some(NvLinkSample {
                links: 18,
                links_up: 18 - down.len() as u32,
                per_link,
                ..NvLinkSample::default()
            }),
            ..GpuFacts::default()
        }
    }

    #[test]
    fn a_down_link_fails_and_says_what_to_do() {
        let (a, b) = (gpu(0, &[]), gpu(3, &[5]));
        let c = nvlink_check(&[&a, &b]).unwrap();
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail
                .starts_with("GPU 3: NVLink link 5 down (17 of 18 up): "),
            "{}",
            c.detail
        );
        assert!(
            c.detail.contains("nvidia-smi nvlink -s -i 3"),
            "{}",
            c.detail
        );
        assert!(c.detail.contains("nvidia-smi -r -i 3"), "{}", c.detail);
    }

    #[test]
    fn all_up_is_ok_and_no_nvlink_is_no_line() {
        let (a, b) = (gpu(0, &[]), gpu(1, &[]));
        let c = nvlink_check(&[&a, &b]).unwrap();
        assert_eq!(
            (c.status, c.detail.as_str()),
            (Status::Ok, "all 36 NVLinks up on 2 GPUs")
        );
        assert_eq!(nvlink_check(&[&GpuFacts::default()]), None);
    }
}
