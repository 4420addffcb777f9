//! A small IMDSv2 server for tests (moto's metadata stub is useless): PUT /latest/api/token issues
//! tokens; GET /latest/meta-data/<path> needs a valid token; faults are scripted per test.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
pub struct ImdsState {
    pub values: BTreeMap<String, String>,
    pub tokens_issued: u32,
    pub valid_token: Option<String>,
    /// Status codes returned to the next GETs, in order, before normal service.
    pub fail_next: Vec<u16>,
    /// Revoke the token after this many successful GETs (forces a 401 → refresh).
    pub revoke_after: Option<u32>,
    pub gets: u32,
    pub requests: Vec<String>,
}

pub struct ImdsServer {
    pub url: String,
    pub state: Arc<Mutex<ImdsState>>,
}

fn respond(stream: &mut std::net::TcpStream, status: u16, body: &str) {
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        _ => "Error",
    };
    let _ = write!(stream, "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
}

impl ImdsServer {
    pub fn start(values: &[(&str, &str)]) -> ImdsServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind IMDS test server");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(ImdsState {
            values: values.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        }));
        let st = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let mut headers = BTreeMap::new();
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                    }
                }
                let mut parts = line.split_whitespace();
                let method = parts.next().unwrap_or("").to_string();
                let path = parts.next().unwrap_or("").to_string();
                let mut s = st.lock().expect("state");
                s.requests.push(format!("{method} {path}"));
                if method == "PUT" && path == "/latest/api/token" {
                    if !headers.contains_key("x-aws-ec2-metadata-token-ttl-seconds") {
                        respond(&mut stream, 400, "missing ttl");
                        continue;
                    }
                    s.tokens_issued += 1;
                    let t = format!("token-{}", s.tokens_issued);
                    s.valid_token = Some(t.clone());
                    respond(&mut stream, 200, &t);
                    continue;
                }
                if method != "GET" {
                    respond(&mut stream, 405, "");
                    continue;
                }
                if !s.fail_next.is_empty() {
                    let code = s.fail_next.remove(0);
                    respond(&mut stream, code, "");
                    continue;
                }
                if headers.get("x-aws-ec2-metadata-token") != s.valid_token.as_ref() || s.valid_token.is_none() {
                    respond(&mut stream, 401, "");
                    continue;
                }
                let key = path.trim_start_matches("/latest/meta-data/").to_string();
                match s.values.get(&key).cloned() {
                    Some(v) => {
                        s.gets += 1;
                        if s.revoke_after == Some(s.gets) {
                            s.valid_token = Some("revoked".into());
                        }
                        respond(&mut stream, 200, &v)
                    }
                    None => respond(&mut stream, 404, ""),
                }
            }
        });
        ImdsServer { url, state }
    }
}
