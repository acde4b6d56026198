//! The direct TCP transport: [`client::TcpClient`] follows a server,
//! [`server::TcpServer`] serves many clients.

pub(crate) mod client;
pub(crate) mod server;
