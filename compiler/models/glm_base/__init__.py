"""What every GLM arch (glm4moe, glm-dsa, ...) builds on: the hyper-parameters and key readers they share
(`config`), and the graph pieces they share (`graph`): norms, projections, the MoE FFN with its shared expert,
the trunk's input and output, the NextN frame and head. Each arch folder imports these public names only."""
