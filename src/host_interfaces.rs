//! The addresses of this host's interfaces, as `getifaddrs` reports them: what the registry
//! client and the sandbox network must never let a tenant reach, or collide with.

use std::net::IpAddr;

/// Every address of every interface, with the interface's name.
pub fn addresses() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we walk and then free exactly once.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut at = head;
        while !at.is_null() {
            let addr = (*at).ifa_addr;
            let name = std::ffi::CStr::from_ptr((*at).ifa_name)
                .to_string_lossy()
                .into_owned();
            if !addr.is_null() {
                match (*addr).sa_family as i32 {
                    libc::AF_INET => {
                        let sin = &*(addr as *const libc::sockaddr_in);
                        out.push((
                            name,
                            IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()),
                        ));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(addr as *const libc::sockaddr_in6);
                        out.push((name, IpAddr::from(sin6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            at = (*at).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out
}
